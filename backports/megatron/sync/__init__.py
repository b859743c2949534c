"""``backports sync``: refresh ``vendor/<backport>/`` from an upstream commit, and check
that nothing drifted. One module per step, as pip's ``vendoring`` is laid out:

- ``fetch``: the bare cache clone, fetching and resolving the commit;
- ``source``: the manifest's source file at that commit (or its planned new location);
- ``rewrite``: the function or method vendored with live look-ups (ast positions);
- ``stage``: the new pair staged beside the folder and swapped in, or put back;
- ``commands``: ``sync``, ``rehash`` and ``check`` as named steps;
- ``cli``: the flags and exit codes (``tools/sync_upstream.py`` wraps it).

``UPSTREAM.toml`` is read and written by ``backports.megatron.upstream_schema`` alone.
Importing this package loads nothing heavy: git and tomlkit are imported when used.
"""
