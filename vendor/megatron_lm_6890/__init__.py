"""NVIDIA/Megatron-LM#6890 / #7104: the fused MLA YaRN RoPE kernels mask on the head index."""
