"""backports/megatron/commands/: each command, its output and streams, usage errors, the
console script in a fresh interpreter."""
