"""The ``backports`` command (console script, ``python -m backports.megatron``).

    backports status | apply | revert | check | audit | new | sync | upstream-tests

A thin face: the commands live in ``backports.megatron.commands``, one module each, and
``main`` is theirs. This address stays: the console script, and the tests ``backports new``
scaffolds, call ``backports.megatron.cli.main``.
"""

from .commands.main import main

__all__ = ["main"]
