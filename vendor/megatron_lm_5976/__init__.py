"""NVIDIA/Megatron-LM#5976: Megatron-FSDP's optimizer pre-initialisation step is inert."""
