# Vendored for megatron-backports; see UPSTREAM.toml beside this file.
# repo:   https://github.com/NVIDIA/Megatron-LM
# pr:     6964 (merged as 53abe744b5e8d043a06e54cfaef44cbe23b1e2ca)
# path:   megatron/core/transformer/attention.py
# symbol: HAVE_FA4 (module-level FA4 probe)
# origin: handwritten in this repository from the pull request's described behaviour;
#         not a byte copy of upstream source.
"""PR #6964's FA4 decision, for ``megatron.core.transformer.attention``'s import.

Upstream's behaviour: FA4 is used only when the ``flash-attn-4`` distribution is
installed; ``flash_attn.cute`` is not imported otherwise. megatron-core 0.18 to 0.19.2
import ``flash_attn.cute`` whenever that import path exists. flash-attn 2.8.x ships a stale
``flash_attn.cute`` that predates FA4, and beside a newer ``nvidia-cutlass-dsl`` it raises
``AttributeError`` (not ``ImportError``, which the probe catches): the module, and
everything that imports it, fails to import.

The attention module's code is module-level, so it cannot be replaced after the fact:
``fa4_import_guard`` is the context that module executes in (see
``backports.megatron.kinds.import_guard``). Without the flash-attn-4 distribution, importing
``flash_attn.cute`` inside it raises ``ModuleNotFoundError``, which the module's FA4 probe
turns into ``HAVE_FA4 = False``, as upstream decides. With the distribution it changes
nothing.

Upstream never reaches ``flash_attn`` for FA4 without the distribution, so neither may the
guard: the ``flash_attn`` package's own ``__init__`` (which ``import flash_attn.cute`` runs
first, before any finder is asked for ``cute``) may raise too. The ``import`` audit event of
``flash_attn.cute`` comes before its parent is imported: raising there keeps the whole
package out of the FA4 probe, as upstream's code does.
"""

import contextlib
import importlib.metadata
import sys
import threading
from collections.abc import Iterator
from typing import Any

# The module whose execution the guard wraps.
__target_module__ = "megatron.core.transformer.attention"

FA4_DISTRIBUTION = "flash-attn-4"
FA4_PACKAGE = "flash_attn.cute"


def fa4_installed() -> bool:
    """Whether the flash-attn-4 distribution is installed (what upstream decides FA4 by)."""
    try:
        importlib.metadata.version(FA4_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


class _NotFA4:
    """A ``sys.meta_path`` finder: ``flash_attn.cute`` without flash-attn-4 is not FA4."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        # importlib.import_module raises no audit event: the finder refuses those lookups.
        if fullname == FA4_PACKAGE or fullname.startswith(FA4_PACKAGE + "."):
            raise _not_fa4(fullname)
        return None


def _not_fa4(fullname: str) -> ModuleNotFoundError:
    return ModuleNotFoundError(
        f"{fullname} is not imported: the {FA4_DISTRIBUTION} distribution is not installed "
        "(a flash_attn.cute without it predates FA4)",
        name=fullname,
    )


# Threads executing the attention module inside the guard (the audit hook acts for them only).
_GUARDING = threading.local()
_AUDITING: list[bool] = []  # one audit hook per process: audit hooks cannot be removed


def _refuse_fa4_imports(event: str, args: tuple[Any, ...]) -> None:
    if event == "import" and getattr(_GUARDING, "depth", 0) and args:
        name = args[0]
        if isinstance(name, str) and (name == FA4_PACKAGE or name.startswith(FA4_PACKAGE + ".")):
            raise _not_fa4(name)


@contextlib.contextmanager
def fa4_import_guard() -> Iterator[None]:
    """While the attention module executes: no FA4 import unless flash-attn-4 is installed."""
    if fa4_installed():
        yield
        return
    if not _AUDITING:
        _AUDITING.append(True)
        sys.addaudithook(_refuse_fa4_imports)
    finder = _NotFA4()
    sys.meta_path.insert(0, finder)
    _GUARDING.depth = getattr(_GUARDING, "depth", 0) + 1
    try:
        yield
    finally:
        _GUARDING.depth -= 1
        sys.meta_path.remove(finder)
