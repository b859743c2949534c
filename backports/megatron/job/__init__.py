"""What runs inside a job's processes, and what a job's environment holds.

- ``start_up``: the hand-over at megatron's first lookup (the trigger itself is in the
  package's ``__init__``), to a hook named by string: nothing else of ours loads before
  megatron has executed;
- ``deferred``: backports waiting for their target's import, decided and installed then;
- ``settling``: decisions to installs and reports; ``announce``: the one warning per job;
- ``ranks``: whether every rank runs the same backports; ``manifest``: what this process
  runs, for logs and checkpoints;
- ``hook_file`` / ``startup_hook``: the start-up hook file the ``apply`` command writes.

This ``__init__`` imports nothing.
"""
