"""NVIDIA/Megatron-LM#6890 / #7104 (issue #7103): the fused MLA YaRN RoPE kernels mask heads.

megatron-core 0.13 to 0.19.2's four autotuned Triton kernels in
``megatron.core.fusions.fused_mla_yarn_rope_apply`` mask with a block-local offset compared
against the global head count. When the autotuned ``BLOCK_H`` does not divide the heads per
rank (12, 20, 24, 40, ...), the last head block's program rotates the next token's first
heads again, or writes past the tensor for the last token: q and k are silently wrong with
``apply_rope_fusion`` and YaRN, differently per machine (the block size is the autotuner's).

The replaced objects are module attributes that are not functions (``Autotuner`` around a
``JITFunction``): ``ModuleAttribute`` targets. ``ApplyMLARotaryEmbQ/KV`` read the kernels as
module globals at call time, so replacing the four attributes is enough.

The sniff runs the kernels in a child interpreter with ``TRITON_INTERPRET=1`` (set before
triton is imported), see ``_rope_kernels_child``; what a child saw is kept per process.
"""

import hashlib
import importlib.util
import json
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TypedDict

from packaging.version import Version

from ..interpreter.children import run_python_file
from ..kinds.module_attribute import ModuleAttribute, ResolvedAttribute
from ..model import (
    VENDOR_PACKAGE,
    BackportSpec,
    Renamed,
    Resolved,
    SniffFailed,
    SniffResult,
    recorded_as,
)

_MODULE = "megatron.core.fusions.fused_mla_yarn_rope_apply"
KERNELS = (
    "rotary_fwd_q_kernel",
    "rotary_bwd_q_kernel",
    "rotary_fwd_kv_kernel",
    "rotary_bwd_kv_kernel",
)
# Upstream's main renamed the four kernels in #5944 (and changed their parameters): there
# the old names are gone, the bug is not (the renamed kernels still mask a block-local
# offset against the head count at d98e8a64dd), and this entry, which replaces the old
# names, cannot install. The verdict says so ("renamed upstream in #5944: check by hand").
RENAMED_IN_5944 = {
    "rotary_fwd_q_kernel": "_mla_rope_fwd_inplace_kernel",
    "rotary_bwd_q_kernel": "_mla_rope_bwd_inplace_kernel",
    "rotary_fwd_kv_kernel": "_mla_rope_fwd_kv_split_kernel",
    "rotary_bwd_kv_kernel": "_mla_rope_bwd_kv_split_kernel",
}
_CHANGE_5944 = "#5944 (e4ba3a30f2d8)"
_VENDORED = f"{VENDOR_PACKAGE}.megatron_lm_6890.fused_mla_yarn_rope_apply"
_CHILD = Path(__file__).with_name("_rope_kernels_child.py")
_CHILD_TIMEOUT_S = 600

# Per kernel, per "BLOCK_H=<n>": {"exact": ..., "guards_intact": ...} (the child's JSON).
KernelRuns = dict[str, dict[str, dict[str, bool]]]


class SetSeen(TypedDict, total=False):
    """What a child saw of one set of kernels (``error``: why the set did not run)."""

    kernels: KernelRuns
    error: str
    megatron: str | None  # the megatron package the child imported


class ChildAnswer(TypedDict):
    sets: dict[str, SetSeen]
    megatron: str


def _address(target: ResolvedAttribute) -> tuple[str, str]:
    """(module, attribute) where a child finds the kernel ``target.original``: the target's
    own module (the installed kernel), the vendored module, or any module holding it."""
    name, kernel = target.attribute, target.original
    # The module holds it, or our replacement stands there (``installed``) and ``original``
    # is what stood before: in a child, where the backports are off, the module holds it.
    # The vendored module first: once installed, its kernel also stands in the target module,
    # where a child (backports off) finds the installed one instead.
    vendored = sys.modules.get(_VENDORED)
    if vendored is not None and getattr(vendored, name, None) is kernel:
        return _VENDORED, name
    if vars(target.module).get(name) is kernel or getattr(target, "installed", None) is not None:
        return target.module.__name__, name
    for module_name, module in list(sys.modules.items()):
        if isinstance(module, ModuleType) and vars(module).get(name) is kernel:
            return module_name, name
    raise SniffFailed(f"{name} is held by no module a child could import it from")


def kernels_in_child(sets: dict[str, dict[str, tuple[str, str]]]) -> ChildAnswer:
    """Run each set of kernels (label -> kernel name -> (module, attribute)) in one fresh
    interpreter under ``TRITON_INTERPRET=1``: isolated (``-I``), in a private working
    folder, on this process's ``sys.path``, with the backports off there."""
    searched = [p for p in sys.path if p]
    request = {"sys_path": searched, "sets": sets}
    env = {**os.environ, "TRITON_INTERPRET": "1", "MEGATRON_BACKPORTS": "0"}
    # Forked from the zygote (torch imported once) where it can stand for a fresh child.
    done = run_python_file(
        _CHILD, [json.dumps(request)], env=env, timeout=_CHILD_TIMEOUT_S, path=searched
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("SNIFF ")]
    if done.returncode != 0 or len(lines) != 1:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SniffFailed(f"the kernel child exited {done.returncode}: {tail[0]}")
    return json.loads(lines[0][len("SNIFF ") :])  # type: ignore[no-any-return]


# What a child saw of a set of kernels, per (the set's addresses, interpreter, sys.path, the
# sha256 of each file the kernels are rebuilt or read from): a child costs an import of torch
# and megatron (seconds), and its outcome depends on nothing else.
_SEEN: dict[tuple[object, ...], SetSeen] = {}


def _file_sha256(module_name: str) -> str | None:
    """The module's file as this process finds it, imported or not (the vendored module is
    judged in the child before the probe imports it here)."""
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    if module is None:
        try:
            spec = importlib.util.find_spec(module_name)
        except ImportError:
            spec = None
        path = spec.origin if spec is not None else None
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None


def _key(addresses: dict[str, tuple[str, str]]) -> tuple[object, ...]:
    modules = sorted({module for module, _ in addresses.values()} | {_MODULE})
    key: tuple[object, ...] = (tuple(sorted(addresses.items())), sys.executable, tuple(sys.path))
    return key + tuple((module, _file_sha256(module)) for module in modules)


# The sniffs on the installed and on the vendored kernels run side by side (two threads):
# the first to ask starts the one child that judges both sets, the other waits for it.
_ASKING = threading.Lock()


def _seen(addresses: dict[str, tuple[str, str]]) -> SetSeen:
    """What a child saw of these kernels. One child judges the installed kernels and the
    vendored ones (the probe asks for both), for one import of torch and megatron."""
    with _ASKING:
        key = _key(addresses)
        if key not in _SEEN:
            sets = {"asked": addresses, **_the_other_set(addresses)}
            seen = kernels_in_child(sets)
            for label, run in seen["sets"].items():
                _SEEN[_key(sets[label])] = {**run, "megatron": seen.get("megatron")}
        seen = json.loads(json.dumps(_SEEN[key]))
    if "error" in seen:
        raise SniffFailed(f"the kernel child could not run them: {seen['error']}")
    return seen  # type: ignore[no-any-return]


def _the_other_set(addresses: dict[str, tuple[str, str]]) -> dict[str, dict[str, tuple[str, str]]]:
    """The set the probe asks for next: the vendored kernels after any other set, the
    installed ones after the vendored."""
    vendored = {name: (_VENDORED, name) for name in KERNELS}
    if addresses == vendored:
        return {"installed": {name: (_MODULE, name) for name in KERNELS}}
    if _file_sha256(_VENDORED) is not None:
        return {"vendored": vendored}
    return {}


def _judge(kernels: KernelRuns) -> dict[str, bool]:
    """Per kernel: True when ``BLOCK_H=4`` (a half-full last block) is exact with every guard
    kept, False when it is not; raises when the control (``BLOCK_H=2``) is not exact, or a
    kernel is missing (a kernel unlike any version)."""
    if sorted(kernels) != sorted(KERNELS):
        raise SniffFailed(f"the child ran {sorted(kernels)}")
    clean = {"exact": True, "guards_intact": True}
    verdicts = {}
    for name in KERNELS:
        runs = kernels[name]
        if runs["BLOCK_H=2"] != clean:
            raise SniffFailed(f"{name} with BLOCK_H=2 (every block full) gave {runs['BLOCK_H=2']}")
        verdicts[name] = runs["BLOCK_H=4"] == clean
    return verdicts


def _sniff(targets: Sequence[Resolved]) -> SniffResult:
    """Fixed iff all four kernels are exact on 6 heads with ``BLOCK_H=4``; needed iff none
    is; some but not all is a release unlike both (incompatible)."""
    addresses = {
        target.attribute: _address(target) for target in recorded_as(targets, ResolvedAttribute)
    }
    seen = _seen(addresses)
    fixed = _judge(seen["kernels"])
    detail = {"kernels": seen["kernels"], "megatron": seen.get("megatron")}
    if all(fixed.values()):
        summary = "the rotary kernels mask on the head index: 6 heads with BLOCK_H=4 are exact"
        return SniffResult(True, summary, detail)
    if not any(fixed.values()):
        summary = (
            "the rotary kernels mask a block-local offset against the head count: 6 heads with "
            "BLOCK_H=4 rotate the next token's heads again and write past the tensor"
        )
        return SniffResult(False, summary, detail)
    raise SniffFailed(f"some kernels mask on the head index, some do not: {fixed}")


SPEC = BackportSpec(
    id="megatron-lm-6890",
    title="Fused MLA YaRN RoPE: the Triton kernels mask on the head index",
    targets=tuple(
        ModuleAttribute(
            distribution="megatron-core",
            modules=(_MODULE,),
            attribute=kernel,
            type_name="triton.runtime.autotuner:Autotuner",
        )
        for kernel in KERNELS
    ),
    # The fused MLA RoPE kernels arrive in 0.13, with the block-local masks.
    target_since=Version("0.13"),
    # Both pull requests are open: no release carries the fix.
    fixed_in=None,
    sniff=_sniff,
    # A child interpreter runs the kernels (~15 s): a job decides from the verdict cache.
    sniff_in_child=True,
    renamed=tuple(Renamed(old, new, _CHANGE_5944) for old, new in RENAMED_IN_5944.items()),
)
