"""``backports candidates --repo CLONE``: which upstream merges since the installed
release's branch point touch code a training job runs, whether the release already has
each, who carries it, and what ``backports new --from-pr`` would say. One module per step,
as ``command`` lists them:

- ``history``: the range (the installed release's branch point, or ``--since``) and its
  merges;
- ``states``: each changed symbol against the installed release (missing, present,
  drifted), read with ``--from-pr``'s symbol map (``from_pr.symbols``, ``from_pr.locate``);
- ``signals``: fix-likeness and reachability (rules written in its doc);
- ``carriers``: the catalog entries (builtins and plugins) that carry a merge;
- ``verdict``: ``--from-pr``'s budget and shape verdict, without any child;
- ``ranking``, ``render``: the order, the 80-column table, the JSON;
- ``derive``: ``--derive K``, ``backports new --from-pr`` on the top K still to carry.

It imports ``from_pr`` and never the other way round; only ``--derive`` starts children.
"""

import argparse
from collections.abc import Callable

__all__ = ["listing"]


def listing(args: argparse.Namespace, progress: Callable[[str], object]) -> str:
    """``backports candidates``: the text to print (``--derive``'s progress to ``progress``)."""
    from .command import listing as list_candidates

    return list_candidates(args, progress)
