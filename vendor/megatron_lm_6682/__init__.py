"""NVIDIA/Megatron-LM#6682: the ``identity`` SFT prompt format masks prompt tokens."""
