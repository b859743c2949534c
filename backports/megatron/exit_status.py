"""The exit status of every ``backports`` command, ``backports sync`` and its
``tools/sync_upstream.py`` wrapper included: one set, so a script tells them apart alike.

Imports nothing: ``sync/`` reads it as the commands do.
"""

DONE = 0
# A check failed: `check` found a backport to fix, `--strict` an incompatible one,
# `audit --fail-on-landed` a landed one, a sync was refused or found drift.
FAILED = 1
# The command could not run: bad arguments, an unknown id, a folder that does not exist or
# cannot be written, a candidate that is not megatron-core or cannot be probed here.
CANNOT_RUN = 2
# Ctrl-C (SIGINT): 128 + the signal's number, as a shell reports a command it interrupted.
INTERRUPTED = 130
