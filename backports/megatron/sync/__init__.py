"""``backports sync``: refresh ``vendor/<backport>/`` from an upstream commit, and check
that nothing drifted. One module per step, as pip's ``vendoring`` is laid out:

- ``fetch``: the bare cache clone, fetching and resolving the commit;
- ``source``: the manifest's source file at that commit (or its planned new location);
- ``scopes`` and ``render``: upstream's pieces vendored into one file, their module-global
  reads made live look-ups (ast positions; the one renderer);
- ``stage``: the new pair staged beside the folder and swapped in, or put back;
- ``verify``: the entry's sniff on the staged file, in a child interpreter;
- ``commands``: ``sync``, ``rehash`` and ``check`` as named steps, each saying what it did
  to a ``SyncReport`` (``report``) and raising a ``SyncError`` (``errors``) where it stops;
- ``cli``: the flags and exit codes. The commands wing (``commands/sync.py``) shows the
  report and turns an error into its line and exit status: nothing here prints.

A vendored folder and its ``UPSTREAM.toml`` are ``backports.megatron.vendored``'s (the one
reader and writer). Importing this package loads nothing heavy: git and tomlkit are
imported when used.
"""
