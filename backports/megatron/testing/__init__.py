"""Helpers for testing backports: what this project's tests use and a plugin's tests may.

Nothing here is imported by ``backports.megatron`` itself, so none of it costs an import
of megatron or torch at interpreter start.

- ``fake_kernel``: ``FakeSparseMLA``, a CPU stand-in for TileLang's SparseMLA kernel
  (its contract, honest FP32 math), for testing SparseMLA fixes without a GPU.
- ``prewarm``: compiles the TileLang SparseMLA kernels a run will need, in parallel,
  before their first use (CUDA hosts with TileLang).
"""
