"""``backports new --from-pr N``: derive a proven backport plugin from an upstream pull
request. One module per step, as ``command`` lists them:

- ``resolve``: the head, merge and base commits (``clone`` reads the user's clone);
- ``symbols``: the diff as changed functions, methods and statements, tagged with their
  shapes (``units``), and the tests the pull request adds or changes;
- ``locate``: each symbol in the installed megatron-core: identical, drifted, absent, new;
- ``budget``: how big a fix may be carried;
- ``vendor``: the vendored module, upstream's text through the sync's assembly, a drifted
  symbol by a three-way merge of this pull request's hunks (``merge``);
- ``sniff`` (``sniff_child``, ``explore``, ``standin``): the sniff, by route a, b or c;
- ``prove`` (``prove_child``): contract kit, ``check``, ``upstream-tests``;
- ``plugin``, ``report``: the plugin's files and what was derived.

The pull request's code runs only in child interpreters (``child``). Everything taken from
the rest of the package comes through ``_tool``.
"""

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from .errors import FromPrError

if TYPE_CHECKING:
    from .command import Derived

__all__ = ["FromPrError", "derive_plugin"]


def derive_plugin(args: argparse.Namespace, say: Callable[[str], object]) -> "Derived":
    """``backports new --from-pr``: the plugin written, or a ``FromPrError`` (its exit status
    and the report so far). Imported when called: the steps weigh, and ``candidates`` reads
    this package's clone and locate modules without them."""
    from .command import derive_plugin as derive

    return derive(args, say)
