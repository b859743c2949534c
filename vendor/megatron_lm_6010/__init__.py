"""NVIDIA/Megatron-LM#6010: the multimodal models hand the loss mask to the language model."""
