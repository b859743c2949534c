"""Other packages' known import-time notices, kept out of the ``backports`` command's output.

Importing megatron-core on a machine without CUDA, Transformer Engine, Apex or absl prints
about a dozen lines of torch and megatron notices before the command's table. They describe
the machine, not the backports, and bury the result. ``hidden()`` drops exactly these
notices (``backports -v`` shows them again); any other warning or log record still shows.
"""

import logging
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["KNOWN_LOG_RECORDS", "KNOWN_WARNINGS", "hidden"]

# (category, start of the message) of notices raised with warnings.warn at import time.
KNOWN_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    (UserWarning, "Transformer Engine and Apex are not installed"),  # megatron.core.optimizer
    (UserWarning, "Apex is not installed"),  # megatron.core.models
    (UserWarning, "absl.logging is not installed"),  # megatron.core.hyper_comm_grid
    (DeprecationWarning, "The following imports from `dynamic_context.py`"),
)

# (logger, start of the message) of notices logged at import time.
KNOWN_LOG_RECORDS: tuple[tuple[str, str], ...] = (
    ("torch.utils.cpp_extension", "No CUDA runtime is found"),  # a CPU-only machine
)


class _DropPrefix(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


@contextmanager
def hidden() -> Iterator[None]:
    """Hide the known notices while the block runs; restore the filters afterwards."""
    dropped = [(logging.getLogger(name), _DropPrefix(prefix)) for name, prefix in KNOWN_LOG_RECORDS]
    with warnings.catch_warnings():
        for category, prefix in KNOWN_WARNINGS:
            warnings.filterwarnings("ignore", message=re.escape(prefix), category=category)
        for logger, drop in dropped:
            logger.addFilter(drop)
        try:
            yield
        finally:
            for logger, drop in dropped:
                logger.removeFilter(drop)
