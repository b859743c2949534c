"""NVIDIA/Megatron-LM#6099: the layer-wise optimizer counts gradients with its TP groups."""
