"""megatron-lm-6964: a stale ``flash_attn.cute`` no longer breaks attention's import.

An import guard (``catalog.spec.ImportGuard``, ``import_guards``): the attention module's
FA4 probe is module-level code, so the fix must be in place before it first runs. The
stale package is a stub that raises as flash-attn 2.8.x's does beside a newer cutlass; FA4
"truly present" is a stub ``flash-attn-4`` distribution with a working ``flash_attn.cute``.
The real attention module is imported in child interpreters (marked slow: ~20-40 s each on
a busy 2-core machine); the guard mechanism itself is tested in-process on a tiny module.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from backports.megatron._vendor.megatron_lm_6964.attention import fa4_import_guard

from backports.megatron import Action, Verdict, apply, revert, status
from backports.megatron.catalog.megatron_lm_6964 import SPEC, stale_flash_attn
from backports.megatron.kinds import import_guard as import_guards
from backports.megatron.kinds import install
from tests import installing
from tests.reports import report_for

ID = "megatron-lm-6964"
ATTENTION = "megatron.core.transformer.attention"
STALE = "AttributeError: module 'cutlass.cute.core' has no attribute 'ThrMma'"


def fa4_present(folder: Path) -> Path:
    """flash-attn-4 installed: its distribution metadata and a flash_attn.cute that works."""
    cute = folder / "flash_attn" / "cute"
    cute.mkdir(parents=True)
    (folder / "flash_attn" / "__init__.py").write_text("")
    (cute / "__init__.py").write_text("def flash_attn_varlen_func(*args, **kwargs):\n    pass\n")
    info = folder / "flash_attn_4-4.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flash-attn-4\nVersion: 4.0.0\n")
    return folder


def run_child(script: str, first_on_path: Path, **env: str) -> list[dict[str, Any]]:
    """Run ``script`` with ``first_on_path`` first on sys.path; each "SEEN {json}" line."""
    import os

    environ = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_BACKPORTS")}
    environ.update(env)
    environ["MEGATRON_BACKPORTS_CACHE"] = "0"
    environ["PYTHONPATH"] = os.pathsep.join([str(first_on_path), *(p for p in sys.path if p)])
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line[5:]) for line in done.stdout.splitlines() if line.startswith("SEEN ")]


IMPORT_ATTENTION = """
import importlib, json, sys
def import_attention():
    try:
        module = importlib.import_module("megatron.core.transformer.attention")
        return {"HAVE_FA4": bool(module.HAVE_FA4)}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
def seen(**what):
    print("SEEN " + json.dumps(what), flush=True)
"""


# --- the sniff (one child each) ----------------------------------------------------------


@pytest.mark.slow
def test_sniff_says_needed_on_0_19_2():
    result = SPEC.sniff([import_guards.GuardTarget(ATTENTION, import_guards.no_guard)])
    assert result.fixed is False
    assert result.detail["stale_flash_attn_cute"] == {"imported": False, "error": STALE}


@pytest.mark.slow
def test_sniff_says_fixed_under_the_vendored_guard():
    result = SPEC.sniff([import_guards.GuardTarget(ATTENTION, fa4_import_guard)])
    assert result.fixed is True
    assert result.detail["stale_flash_attn_cute"] == {"imported": True, "HAVE_FA4": False}


# --- the real module in child interpreters ---------------------------------------------------


@pytest.mark.slow
def test_stale_cute_breaks_the_import_and_apply_before_it_fixes_it_and_revert_undoes(tmp_path):
    seen = run_child(
        IMPORT_ATTENTION
        + """
seen(step="stock", **import_attention())
from backports.megatron import apply, revert
(report,) = apply(only="megatron-lm-6964")
seen(step="apply", action=str(report.action), verdict=str(report.verdict))
seen(step="applied", **import_attention())
import megatron.core.transformer.attention as attention
import megatron.core.models.gpt.gpt_layer_specs  # what every GPT model build imports
seen(step="gpt_layer_specs", ok=True)
(report,) = revert(only="megatron-lm-6964")
seen(step="revert", action=str(report.action))
del sys.modules["megatron.core.transformer.attention"]
seen(step="reverted", **import_attention())
""",
        stale_flash_attn(tmp_path),
    )
    assert seen == [
        {"step": "stock", "error": STALE},
        {"step": "apply", "action": "installed", "verdict": "needed"},
        {"step": "applied", "HAVE_FA4": False},
        {"step": "gpt_layer_specs", "ok": True},
        {"step": "revert", "action": "reverted"},
        {"step": "reverted", "error": STALE},
    ]


@pytest.mark.slow
def test_the_start_up_hook_guards_the_first_import(tmp_path):
    """What the hook file's line runs: the trigger fires on megatron's first lookup."""
    seen = run_child(
        IMPORT_ATTENTION
        + """
import backports.megatron as backports
backports._start_up(("megatron",), {"strict": False, "only": None})
seen(step="hooked", **import_attention())
from backports.megatron.api import last_report
report = last_report("megatron-lm-6964")
seen(step="report", action=str(report.action))
""",
        stale_flash_attn(tmp_path),
    )
    assert seen == [
        {"step": "hooked", "HAVE_FA4": False},
        {"step": "report", "action": "installed"},
    ]


@pytest.mark.slow
def test_switched_off_the_import_fails_as_on_0_19_2(tmp_path):
    seen = run_child(
        IMPORT_ATTENTION
        + """
import backports.megatron as backports
backports._start_up(("megatron",), {"strict": False, "only": None})
from backports.megatron import apply
(report,) = apply(only="megatron-lm-6964")
seen(step="apply", verdict=str(report.verdict))
seen(step="import", **import_attention())
""",
        stale_flash_attn(tmp_path),
        MEGATRON_BACKPORTS_SKIP=ID,
    )
    assert seen == [{"step": "apply", "verdict": "disabled"}, {"step": "import", "error": STALE}]


@pytest.mark.slow
def test_fa4_truly_present_stays_on(tmp_path):
    seen = run_child(
        IMPORT_ATTENTION
        + """
from backports.megatron import apply
(report,) = apply(only="megatron-lm-6964")
seen(step="apply", action=str(report.action))
seen(step="import", **import_attention())
""",
        fa4_present(tmp_path),
    )
    assert seen == [{"step": "apply", "action": "installed"}, {"step": "import", "HAVE_FA4": True}]


# --- in-process: reports, and the guard on a tiny module -----------------------------------


def test_apply_installs_the_guard_and_revert_removes_it():
    report = report_for(apply(only=ID), ID)
    assert (report.verdict, report.action) == (Verdict.NEEDED, Action.INSTALLED)
    assert ATTENTION in report.reason and "fa4_import_guard" in report.reason
    installation = install.installed(ID)
    assert installation is not None and installation.parts[0].resolved.module_name == ATTENTION
    assert report_for(apply(only=ID), ID).action is Action.ALREADY_INSTALLED
    reverted = report_for(revert(only=ID), ID)
    assert reverted.action is Action.REVERTED and ATTENTION in reverted.reason
    assert install.installed(ID) is None
    assert report_for(revert(only=ID), ID).action is Action.NOT_INSTALLED


def test_skip_switch_leaves_it_off(monkeypatch):
    monkeypatch.setenv("MEGATRON_BACKPORTS_SKIP", ID)
    report = report_for(apply(only=ID), ID)
    assert report.verdict is Verdict.DISABLED and install.installed(ID) is None


def test_ranks_see_the_installed_guard():
    from backports.megatron.job.ranks import installed_backports

    assert ID not in installed_backports()
    apply(only=ID)
    assert ID in installed_backports()


@pytest.mark.slow
def test_status_on_0_19_2_says_needed_with_its_reason():
    report = report_for(status(only=ID), ID)
    assert report.verdict is Verdict.NEEDED and report.action is Action.WOULD_INSTALL
    assert "AttributeError" in report.reason and "flash-attn-4" in report.reason
    assert report.evidence["target"]["kind"] == "import-guard"


@pytest.fixture
def tiny_module(tmp_path, monkeypatch):
    """A module whose execution records whether a guard was around it."""
    (tmp_path / "guarded_by_test.py").write_text(
        "import guard_state\nRAN_INSIDE = guard_state.inside\n"
    )
    state = type(sys)("guard_state")
    state.inside = False
    monkeypatch.setitem(sys.modules, "guard_state", state)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield state
    sys.modules.pop("guarded_by_test", None)
    install.uninstall("test-guard")


def test_the_guard_runs_around_the_module_execution_and_only_while_installed(tiny_module):
    import contextlib
    import importlib

    @contextlib.contextmanager
    def guard():
        tiny_module.inside = True
        try:
            yield
        finally:
            tiny_module.inside = False

    target = import_guards.ImportGuard("megatron-core", ("guarded_by_test",), "RAN_INSIDE")
    resolved = import_guards.KIND.resolve(target, "test-guard")
    installation, fresh = installing.install("test-guard", [(target, resolved, guard)])
    assert fresh and installation.mode == "local-changes"
    assert importlib.import_module("guarded_by_test").RAN_INSIDE is True
    assert tiny_module.inside is False  # exited after the execution
    assert install.installed("test-guard").parts[0].record.executions == ["ok"]
    install.uninstall("test-guard")
    sys.modules.pop("guarded_by_test")
    assert importlib.import_module("guarded_by_test").RAN_INSIDE is False


@pytest.mark.slow
def test_status_runs_the_two_children_at_once_and_then_reuses_their_verdict(monkeypatch, tmp_path):
    """Cold: both children (stock and vendored guard) run, side by side. Warm: none runs,
    and the verdict, reason and what the children saw are the cold run's."""
    import time

    from backports.megatron.catalog import megatron_lm_6964

    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE", "1")
    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(megatron_lm_6964, "_SEEN", {})  # no answer remembered in this process
    spans: list[tuple[float, float]] = []
    real = megatron_lm_6964.import_in_child

    def timed(guard, first_on_path):
        start = time.monotonic()
        try:
            return real(guard, first_on_path)
        finally:
            spans.append((start, time.monotonic()))

    monkeypatch.setattr(megatron_lm_6964, "import_in_child", timed)
    cold = report_for(status(only=ID), ID)
    assert cold.verdict is Verdict.NEEDED and cold.evidence["cache"]["hit"] is False
    assert len(spans) == 2
    (first, second) = sorted(spans)
    assert second[0] < first[1]  # the second started before the first ended
    shown = cold.evidence["vendored_behaviour"]
    assert shown["upstream-only"]["fixed"] is True and shown["local-changes"]["fixed"] is True

    monkeypatch.setattr(megatron_lm_6964, "_SEEN", {})
    warm = report_for(status(only=ID), ID)
    assert len(spans) == 2  # no child this time
    assert warm.evidence["cache"]["hit"] is True
    assert (warm.verdict, warm.reason) == (cold.verdict, cold.reason)
    assert warm.evidence["behaviour"] == cold.evidence["behaviour"]


def _flash_attn_whose_init_raises(folder: Path) -> Path:
    """A ``flash_attn`` package whose own ``__init__`` raises a non-ImportError (a broken
    install): ``import flash_attn.cute`` runs it before any finder is asked for ``cute``."""
    (folder / "flash_attn" / "cute").mkdir(parents=True)
    (folder / "flash_attn" / "__init__.py").write_text(
        "raise AttributeError('broken flash_attn')\n"
    )
    (folder / "flash_attn" / "cute" / "__init__.py").write_text("")
    return folder


def test_the_guard_keeps_the_flash_attn_package_out_of_the_fa4_import(tmp_path, monkeypatch):
    """Upstream's fix never imports flash_attn for FA4 without flash-attn-4: the guard keeps
    the package's own __init__ (run before any finder is asked for ``cute``) out of the FA4
    probe's import too (issue 33 item 14). Without the guard it raises out of the probe."""
    monkeypatch.syspath_prepend(str(_flash_attn_whose_init_raises(tmp_path)))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    probe = "from flash_attn.cute import flash_attn_varlen_func"  # attention.py's FA4 import
    with pytest.raises(AttributeError, match="broken flash_attn"):
        exec(probe)
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    with fa4_import_guard(), pytest.raises(ModuleNotFoundError, match="flash-attn-4"):
        exec(probe)  # an ImportError: the probe's own except turns it into HAVE_FA4 = False
    assert "flash_attn" not in sys.modules


_ATTEMPTS = """
import os, traceback
def where_and_what():
    try:
        module = importlib.import_module("megatron.core.transformer.attention")
        return {"HAVE_FA4": bool(module.HAVE_FA4)}
    except Exception as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        files = [os.path.basename(f.filename) + f":{f.lineno}" for f in frames[-2:]]
        return {"error": f"{type(exc).__name__}: {exc}", "at": files}
seen(step="broken", **where_and_what())
# The package mended (taken off the path): the next import of attention goes through.
sys.path[:] = [p for p in sys.path if p != BROKEN]
for name in [n for n in sys.modules if n.partition(".")[0] == "flash_attn"]:
    del sys.modules[name]
seen(step="mended", **where_and_what())
from backports.megatron.api import last_report
report = last_report("megatron-lm-6964")
seen(step="report", action=None if report is None else str(report.action))
"""


@pytest.mark.slow
@pytest.mark.parametrize("backport", ["stock", "on"])
def test_a_raising_flash_attn_init_behaves_as_on_0_19_2(tmp_path, backport):
    """A ``flash_attn`` whose own ``__init__`` raises (not ImportError) breaks megatron-core
    0.19.2's own import, long before attention executes: ``megatron.core`` imports
    ``rope_utils``, which catches only ImportError from ``flash_attn.layers.rotary``
    (upstream's main still does). With #6964 on, the import fails in the very same place
    with the same error, and goes through once the package is mended, the guard in place:
    it makes it no worse (nor hides it)."""
    broken = _flash_attn_whose_init_raises(tmp_path)
    start = (
        ""
        if backport == "stock"
        else (
            "import backports.megatron as backports\n"
            'backports._start_up(("megatron",), {"strict": False, "only": None})\n'
        )
    )
    seen = run_child(
        IMPORT_ATTENTION + f"BROKEN = {str(broken)!r}\n" + start + _ATTEMPTS,
        broken,
        **({"MEGATRON_BACKPORTS": "0"} if backport == "stock" else {}),
    )
    assert seen == [
        {
            "step": "broken",
            "error": "AttributeError: broken flash_attn",
            "at": ["rope_utils.py:33", "__init__.py:1"],
        },
        {"step": "mended", "HAVE_FA4": False},
        # On: the guard was in place for both imports (stock: nothing was decided).
        {"step": "report", "action": None if backport == "stock" else "installed"},
    ]
