"""NVIDIA/Megatron-LM#6507: the optimizer builder releases every parameter's high-precision
init value (FP8 / MXFP8 primary weights)."""
