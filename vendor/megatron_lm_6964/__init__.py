"""NVIDIA/Megatron-LM#6964: FA4 is decided by the flash-attn-4 distribution, not the path."""
