"""backports/megatron/catalog/: how entries are found (builtins and plugins), their
targets, the contract kit run over every builtin."""
