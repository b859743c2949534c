#!/usr/bin/env python3
"""``backports sync`` from a checkout: the same flags, output and exit codes.

    python tools/sync_upstream.py --backport megatron-lm-7617 --pr 7617
    python tools/sync_upstream.py --backport megatron-lm-7617 --sha SHA --repo ../Megatron-LM
    python tools/sync_upstream.py --backport megatron-lm-7617 --rehash
    python tools/sync_upstream.py --check

The sync lives in the installed package (``backports/megatron/sync/``), so a plugin
author who pip-installed megatron-backports runs ``backports sync`` instead. Exit status:
0 done, 1 refused or drift, 2 an error, 130 interrupted.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(1, str(ROOT))  # this checkout's package, installed or not

from backports.megatron.commands import sync as command  # noqa: E402

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    return command.main(argv, prog="sync_upstream.py")


if __name__ == "__main__":
    sys.exit(main())
