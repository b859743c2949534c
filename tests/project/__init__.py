"""The repository itself: layering, packaging, bootstrap, docs that run, the performance
page, the benchmarks and the GPU jobs rehearsed on CPU."""
