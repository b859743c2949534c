"""NVIDIA/Megatron-LM#6793: one DSA index-share carrier per checkpointed forward."""
