"""The one error of ``backports candidates``: the clone or the installed release cannot be
read (exit 2, one line, printed by the command runner before anything else is)."""

from ...errors import BackportError


class CannotRead(BackportError):
    """The clone, its history or the installed megatron-core cannot be read."""
