"""Helpers for testing backports: what this project's tests use and a plugin's tests may.

- ``CONTRACT`` (``contract``): the checks every catalog entry passes, builtin or plugin:
  its sniff says ``needed`` on the installed megatron-core and fixed on its own vendored
  code (with the local changes and upstream-only), ``apply`` then ``revert`` restores the
  very objects, ``status`` lists it once, strict mode refuses a target unlike any version,
  the vendored files match their hashes, and a reload of the target is patched again.
- ``fake_kernel``: ``FakeSparseMLA``, a CPU stand-in for TileLang's SparseMLA kernel
  (its contract, honest FP32 math), for testing SparseMLA fixes without a GPU.
- ``prewarm``: compiles the TileLang SparseMLA kernels a run will need, in parallel,
  before their first use (CUDA hosts with TileLang).

Nothing in ``backports.megatron`` imports this package, so none of it costs a job anything.
"""

from .contract import CONTRACT, Check

__all__ = ["CONTRACT", "Check"]
