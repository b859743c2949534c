"""What the tool raises or warns with; every error it raises is a BackportError."""

__all__ = ["BackportError", "BackportWarning"]


class BackportError(RuntimeError):
    """A backport cannot be applied as asked (``strict=True``, bad input, mixed ranks)."""


class BackportWarning(UserWarning):
    """A backport was skipped: already upstream, incompatible, or its target is absent."""


class StartUpFailure(BackportError):
    """A strict start-up hook's ``apply()`` failed: the import of megatron itself fails."""

    fatal_on_import = True
