"""Vendored upstream code, one sub-package per upstream pull request.

Installed as ``backports.megatron._vendor``. Nothing here imports the tool: each
sub-package holds the upstream version of the patched function(s) and an
``UPSTREAM.toml`` that says where it came from.
"""
