"""backports/megatron/evidence/: git ancestry, the versions imported, each target's
distribution."""
