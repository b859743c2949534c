"""NVIDIA/Megatron-LM#6624 alone: under GTP the weight gradient is emitted in main_grad's dtype."""
