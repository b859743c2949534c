"""backports/megatron/vendored/: the vendored folders, their integrity check, UPSTREAM.toml,
and the sniff of what is installed."""
