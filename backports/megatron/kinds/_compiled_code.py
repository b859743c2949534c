"""Code ``torch.compile`` traced before a backport was installed: it may still run the original.

Dynamo inlines the methods a compiled function calls. A method replaced on its class
afterwards (6114's ``TopKRouter._apply_expert_bias``) is not guarded by that compiled code:
it keeps running the inlined original while the report says installed. A module-level
function is guarded (dynamo checks the global it read), so only method targets need this.

``drop_stale`` finds every code object dynamo holds compiled code for, drops that code (it
recompiles on its next call, now through the backport), and names it for the report. Which
of them inlined the original cannot be told from outside dynamo, so all are dropped: a
recompile is cheap beside training on the wrong code. Nothing here imports torch: with
dynamo never loaded, nothing was compiled.
"""

import sys
from collections.abc import Iterable
from types import ModuleType


def _compiled(dynamo: ModuleType) -> list[str]:
    """ "qualname (file:line)" of each code object dynamo holds compiled code for."""
    from torch._dynamo import convert_frame
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    names = []
    for ref in list(convert_frame.input_codes.seen):
        code = ref()
        if code is not None and _debug_get_cache_entry_list(code):
            names.append(f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno})")
    return names


def drop_stale(is_method: Iterable[bool]) -> list[str]:
    """Drop what torch.compile compiled before a method target is replaced; the callers'
    names (empty: nothing was compiled, or no target is a method)."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None or not any(is_method):
        return []
    names = _compiled(dynamo)
    if names:
        dynamo.reset_code_caches()
    return names
