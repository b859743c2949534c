"""backports/megatron/interpreter/: the import hooks, the zygote, the children the tool
starts and what they take from the caller."""
