"""NVIDIA/Megatron-LM#6321: ``--exit-on-missing-checkpoint`` ends the job with status 1."""
