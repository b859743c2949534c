"""NVIDIA/Megatron-LM#6114: padded tokens leave expert-bias counts by token, not by expert."""
