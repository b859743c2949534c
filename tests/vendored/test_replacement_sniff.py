"""What is installed is sniffed: the entry's own sniff on the vendored replacement.

``decision.sniff_vendored``, and the probe that runs it (issue 23.1): a vendored
folder whose function lacks the fix (here: megatron-core 0.19.2's own function, or a
hand-written file without the NoPE pad) makes the backport ``incompatible``, names
``vendor/<id>``, fails ``check`` and installs nothing, in either mode. Each test works on a
copy of vendor/ importable as its own package (rehashed, so the integrity check passes and
only behaviour can refuse it), on real megatron-core 0.19.2.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from backports.megatron import Action, Verdict, apply, catalog, cli, status
from backports.megatron.catalog import CATALOG, MEGATRON_LM_7617, BackportSpec
from backports.megatron.decision import sniff_vendored as sniff_replacement
from backports.megatron.kinds import install as patcher
from backports.megatron.kinds import kind_of
from backports.megatron.local_changes import LocalChange
from backports.megatron.vendored import python_files_digest, vendored_module
from tests.deciding import resolve_target
from tests.paths import ROOT

PACKAGE = "unproven_vendor"
IDS = [spec.id for spec in CATALOG]
# Entries that replace functions (an import guard replaces none: no stock function to vendor).
FUNCTION_IDS = [spec.id for spec in CATALOG if not kind_of(spec.target).before_import]
BY_ID = {spec.id: spec for spec in CATALOG}
# What ``status`` judges by sniffing: an entry whose sniff runs on demand (#7466's two ranks)
# reads "not yet checked" there; its stock function is judged by the sniff tests above.
STATUS_SNIFFED_IDS = [i for i in FUNCTION_IDS if not BY_ID[i].sniff_on_demand]

# Writes one vendored module's text into a copy of vendor/ and returns the entry reading it.
Vendor = Callable[[BackportSpec, str], BackportSpec]


def folder_of(spec: BackportSpec) -> str:
    return spec.id.replace("-", "_")


def stock_source(spec: BackportSpec) -> str:
    """A vendored module whose replacements are megatron-core 0.19.2's own functions (the
    undecorated bodies), as a sync to a commit before the fix would write."""
    lines = ["import importlib", "import inspect", ""]
    for target in spec.targets:
        resolved = resolve_target(target, spec.id)
        module = f"importlib.import_module({resolved.module_name!r})"
        if target.owner_name is None:
            found = f"{module}.{target.name}"
        else:
            found = f"vars({module}.{target.owner_name})[{target.name!r}]"
        lines.append(f"{target.replacement_name} = inspect.unwrap({found})")
    return "\n".join(lines) + "\n"


def without_nope(spec: BackportSpec) -> str:
    """#7617's vendored file as it was before the fix: width 576 only (its own pad of width
    512 inputs is then never reached)."""
    text = (ROOT / "vendor" / folder_of(spec) / "tilelang_dsa.py").read_text()
    limit = "if query.size(-1) not in (512, 576) or v_channels != 512:"
    assert text.count(limit) == 1
    return text.replace(limit, "if query.size(-1) != 576 or v_channels != 512:")


def rehash(folder: Path, name: str) -> None:
    """UPSTREAM.toml's sha256 and files_sha256 for the folder as it now is."""
    manifest = folder / "UPSTREAM.toml"
    text = manifest.read_text()
    digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    text = re.sub(r'(?m)^sha256 = "[0-9a-f]+"', f'sha256 = "{digest}"', text)
    files = python_files_digest(folder)
    text = re.sub(r'(?m)^files_sha256 = "[0-9a-f]+"', f'files_sha256 = "{files}"', text)
    manifest.write_text(text)


@pytest.fixture
def vendor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Vendor]:
    """vendor/ copied to ``<tmp>/unproven_vendor``; ``vendor(spec, text)`` writes ``text``
    as the entry's vendored module there and makes that entry the whole catalog."""
    copy = tmp_path / PACKAGE
    shutil.copytree(ROOT / "vendor", copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(spec: BackportSpec, text: str) -> BackportSpec:
        folder = copy / folder_of(spec)
        name = f"{spec.vendored.module}.py"
        (folder / name).write_text(text)
        rehash(folder, name)
        package = f"{PACKAGE}.{folder_of(spec)}"
        entry = dataclasses.replace(
            spec, vendored=dataclasses.replace(spec.vendored, package=package)
        )
        monkeypatch.setattr(catalog, "CATALOG", (entry,))
        return entry

    yield write
    for name in [n for n in sys.modules if n == PACKAGE or n.startswith(f"{PACKAGE}.")]:
        del sys.modules[name]


def check_json(backport_id: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = cli.main(["check", "--json", "--only", backport_id])
    (row,) = [r for r in json.loads(capsys.readouterr().out) if r["id"] == backport_id]
    return code, row


# ---- sniff_replacement -------------------------------------------------------------------


@pytest.mark.parametrize("backport_id", IDS)
@pytest.mark.parametrize("upstream_only", [True, False])
def test_the_vendored_replacements_show_their_fix(backport_id: str, upstream_only: bool) -> None:
    """In both modes: composed with #7617's local changes, the sniff's recording kernel
    still reaches the vendored function inside (else the call would be declined)."""
    spec = BY_ID[backport_id]
    module = vendored_module(spec.vendored)
    for part in spec.parts():  # an entry with copies: each distribution's part on its own
        result = sniff_replacement(part, module, upstream_only=upstream_only)
        assert result.fixed, result.summary


@pytest.mark.parametrize("backport_id", FUNCTION_IDS)
def test_a_stock_function_as_replacement_is_not_shown_fixed(backport_id: str) -> None:
    spec = BY_ID[backport_id]
    module = ModuleType("stock_as_vendored")
    exec(compile(stock_source(spec), "<stock>", "exec"), vars(module))
    result = sniff_replacement(spec, module, upstream_only=True)
    assert not result.fixed


def test_local_changes_hide_a_7617_replacement_without_the_fix() -> None:
    """Why upstream-only alone is sniffed too: the local changes pad width 512 to 576."""
    module = ModuleType("no_nope")
    module.__file__ = "<no_nope>"
    exec(compile(without_nope(MEGATRON_LM_7617), "<no_nope>", "exec"), vars(module))
    alone = sniff_replacement(MEGATRON_LM_7617, module, upstream_only=True)
    composed = sniff_replacement(MEGATRON_LM_7617, module, upstream_only=False)
    assert not alone.fixed and "declined" in alone.summary
    assert composed.fixed


def test_a_stub_is_unfinished_without_running_the_sniff(monkeypatch) -> None:
    """The template ``backports new`` leaves: caught even by a sniff that swallows errors."""
    stub = ModuleType("stub")

    def fused_sparse_mla_absorbed(query, key, topk_indices, softmax_scale, v_channels):  # type: ignore[no-untyped-def]
        """Write the fixed function here."""
        raise NotImplementedError("write the fixed function here")

    stub.fused_sparse_mla_absorbed = fused_sparse_mla_absorbed  # type: ignore[attr-defined]
    spec = dataclasses.replace(MEGATRON_LM_7617, sniff=lambda targets: pytest.fail("ran"))
    for upstream_only in (True, False):
        result = sniff_replacement(spec, stub, upstream_only=upstream_only)
        assert not result.fixed and result.detail["unfinished"] is True
        assert result.summary == (
            "test_a_stub_is_unfinished_without_running_the_sniff.<locals>."
            "fused_sparse_mla_absorbed is a stub: its body only raises NotImplementedError"
        )


def test_an_exception_is_not_shown_fixed() -> None:
    module = ModuleType("raising")

    def fused_sparse_mla_absorbed(query, key, topk_indices, softmax_scale, v_channels):  # type: ignore[no-untyped-def]
        if query.size(-1) == 512:
            raise NotImplementedError("NoPE not written yet")
        raise ValueError("nor anything else\nsecond line")

    module.fused_sparse_mla_absorbed = fused_sparse_mla_absorbed  # type: ignore[attr-defined]
    result = sniff_replacement(MEGATRON_LM_7617, module, upstream_only=True)
    assert not result.fixed
    # The aligned control call comes first: its ValueError is what the sniff meets.
    assert result.summary == "the sniff raised ValueError: nor anything else"
    assert result.detail == {"raised": "ValueError: nor anything else", "unfinished": False}
    missing = sniff_replacement(MEGATRON_LM_7617, ModuleType("empty"), upstream_only=True)
    assert not missing.fixed and missing.detail["unfinished"] is False
    assert "AttributeError" in missing.summary


def test_a_not_implemented_error_from_the_sniff_is_unfinished() -> None:
    module = vendored_module(MEGATRON_LM_7617.vendored)

    def unwritten(targets):  # type: ignore[no-untyped-def]
        raise NotImplementedError("say which observation means the fix is present")

    spec = dataclasses.replace(MEGATRON_LM_7617, sniff=unwritten)
    result = sniff_replacement(spec, module, upstream_only=True)
    assert not result.fixed and result.detail["unfinished"] is True
    assert result.summary == (
        "the sniff raised NotImplementedError: say which observation means the fix is present"
    )


# ---- the probe: status, check, apply --------------------------------------------------------


@pytest.mark.parametrize("backport_id", STATUS_SNIFFED_IDS)
@pytest.mark.parametrize("upstream_only", ["1", "0"])
def test_a_vendored_stock_function_is_incompatible_and_never_installed(
    backport_id: str,
    upstream_only: str,
    vendor: Vendor,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("MEGATRON_BACKPORTS_UPSTREAM_ONLY", upstream_only)
    spec = vendor(BY_ID[backport_id], stock_source(BY_ID[backport_id]))
    (report,) = status(backport_id)
    assert (report.verdict, report.action) == (Verdict.INCOMPATIBLE, Action.WOULD_SKIP)
    assert f"vendor/{folder_of(spec)} lacks the fix, upstream-only: " in report.reason
    assert "\n" not in report.reason
    shown = report.evidence["vendored_behaviour"]["upstream-only"]
    assert shown["fixed"] is False
    with pytest.warns(Warning, match=f"vendor/{folder_of(spec)}"):
        (applied,) = apply(backport_id)
    assert (applied.verdict, applied.action) == (Verdict.INCOMPATIBLE, Action.SKIPPED)
    assert patcher.installed(backport_id) is None
    code, row = check_json(backport_id, capsys)
    assert code == 1
    assert (row["verdict"], row["check"]["ok"]) == ("incompatible", False)
    # An entry with copies names the distribution of each copy's reason first.
    copy = f"[{spec.target.distribution}] " if spec.copies else ""
    assert row["check"]["why"].startswith(
        f"would install code without the fix: {copy}vendor/{folder_of(spec)} lacks the fix"
    )


@pytest.mark.usefixtures("tilelang_dsa")
def test_7617_local_changes_never_mask_a_vendored_function_without_the_fix(
    vendor: Vendor, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Default mode, local changes present: the composed function passes the sniff (they
    pad width 512 to 576 before the vendored function sees it), upstream-only alone does
    not, and that refuses the backport."""
    monkeypatch.delenv("MEGATRON_BACKPORTS_UPSTREAM_ONLY", raising=False)
    vendor(MEGATRON_LM_7617, without_nope(MEGATRON_LM_7617))
    (report,) = status(MEGATRON_LM_7617.id)
    assert report.verdict is Verdict.INCOMPATIBLE
    assert report.evidence["mode"] == "local-changes"
    shown = report.evidence["vendored_behaviour"]
    assert (shown["local-changes"]["fixed"], shown["upstream-only"]["fixed"]) == (True, False)
    assert report.reason.startswith("vendor/megatron_lm_7617 lacks the fix, upstream-only: ")
    assert "declined" in report.reason
    assert "(with the local changes it passes: they hide it)" in report.reason
    with pytest.warns(Warning, match="megatron_lm_7617 lacks the fix"):
        (applied,) = apply(MEGATRON_LM_7617.id, upstream_only=False)
    assert applied.action is Action.SKIPPED
    assert patcher.installed(MEGATRON_LM_7617.id) is None
    code, _ = check_json(MEGATRON_LM_7617.id, capsys)
    assert code == 1


@pytest.mark.usefixtures("tilelang_dsa")
def test_the_real_vendored_code_still_installs(vendor: Vendor) -> None:
    """The control: the same copy, with #7617's own vendored text, is needed and installs."""
    text = (ROOT / "vendor" / "megatron_lm_7617" / "tilelang_dsa.py").read_text()
    vendor(MEGATRON_LM_7617, text)
    (report,) = apply(MEGATRON_LM_7617.id, upstream_only=False)
    assert (report.verdict, report.action) == (Verdict.NEEDED, Action.INSTALLED)
    shown = report.evidence["vendored_behaviour"]
    assert shown["local-changes"]["fixed"] and shown["upstream-only"]["fixed"]


@pytest.mark.usefixtures("tilelang_dsa")
def test_local_changes_that_lose_the_fix_refuse_the_default_mode_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A local change that declines every call: the default mode would install a no-op."""

    def declining(inner):  # type: ignore[no-untyped-def]
        def fused_sparse_mla_absorbed(query, key, topk_indices, softmax_scale, v_channels):  # type: ignore[no-untyped-def]
            return None

        return fused_sparse_mla_absorbed

    change = LocalChange("declines", "declines every call", declining)
    spec = dataclasses.replace(MEGATRON_LM_7617, local_changes=(change,))
    monkeypatch.setattr(catalog, "CATALOG", (spec,))
    monkeypatch.delenv("MEGATRON_BACKPORTS_UPSTREAM_ONLY", raising=False)
    (report,) = status(spec.id)
    assert report.verdict is Verdict.INCOMPATIBLE
    assert report.reason.startswith(
        "vendor/megatron_lm_7617 with the local changes does not show the fix: "
    )
    monkeypatch.setenv("MEGATRON_BACKPORTS_UPSTREAM_ONLY", "1")
    (report,) = status(spec.id)
    assert report.verdict is Verdict.NEEDED
    assert list(report.evidence["vendored_behaviour"]) == ["upstream-only"]
