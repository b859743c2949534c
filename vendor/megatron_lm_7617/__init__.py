"""NVIDIA/Megatron-LM#7617: NoPE (width 512) and unaligned top-k in TileLang sparse MLA."""
