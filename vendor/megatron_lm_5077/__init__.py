"""NVIDIA/Megatron-LM#5077: fully-reshardable optimizer state read at the right offsets."""
