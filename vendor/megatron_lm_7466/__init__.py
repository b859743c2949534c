"""NVIDIA/Megatron-LM#7466 (open): vocab-parallel label smoothing over the whole vocabulary."""
