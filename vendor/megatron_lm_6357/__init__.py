"""NVIDIA/Megatron-LM#6357 (two of its halves): MFSDP v1's unit modules and main_grad."""
