"""NVIDIA/Megatron-LM#7091: decline sparse-indexer top-k widths TileLang cannot lay out."""
