"""backports/megatron/upstream_tests/ (``backports upstream-tests``), its pytest plugin, and
tools/upstream_bundle.py."""
