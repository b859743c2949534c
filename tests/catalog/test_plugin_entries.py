"""backports/megatron/catalog/_plugins.py: catalog entries from the ``megatron_backports``
entry points.

Every plugin here is a real distribution as importlib.metadata sees one: a ``*.dist-info``
folder (METADATA, entry_points.txt) beside its package, on ``sys.path``. The entries reuse
the builtin #7617 entry under other ids, so what the loader hands on is a real entry that
the probe can run on megatron-core 0.19.2.
"""

import importlib
import importlib.metadata
import itertools
import json
import signal
import sys
import textwrap
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from backports.megatron import (
    BackportWarning,
    Verdict,
    apply,
    catalog,
    cli,
    revert,
    status,
)
from backports.megatron.catalog import (
    MEGATRON_LM_7617,
    _plugins,
    megatron_lm_6890,
    megatron_lm_6964,
)
from backports.megatron.catalog._plugins import GROUP, Withheld
from backports.megatron.job import startup_hook as job_start
from tests.conftest import BACKPORT_ID, swap_keeping_answers

_counter = itertools.count()

# A plugin's entry module: the builtin entry under the ids it is given.
CLONES = """
import dataclasses
from backports.megatron.catalog import MEGATRON_LM_7617

def clone(backport_id):
    return dataclasses.replace(MEGATRON_LM_7617, id=backport_id)
"""

MakePlugin = Callable[..., str]


@pytest.fixture
def make_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakePlugin]:
    """``make_plugin(dist, {entry-point name: body of the module it names}, version=)``:
    writes the package and its dist-info, puts them on sys.path; returns the package name.

    Each body defines ``VALUE``; the entry point names ``<package>.<module>:VALUE``.
    """
    packages: list[str] = []
    roots: list[str] = []
    catalog.reload()

    def make(dist: str, modules: dict[str, str], version: str = "1.0") -> str:
        package = f"plugin_{dist.replace('-', '_').lower()}_{next(_counter)}"
        root = tmp_path / package
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
        lines = [f"[{GROUP}]"]
        for index, (name, body) in enumerate(modules.items()):
            module = f"entry{index}"
            (root / package / f"{module}.py").write_text(CLONES + textwrap.dedent(body))
            lines.append(f"{name} = {package}.{module}:VALUE")
        info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        # Not monkeypatch.syspath_prepend: its undo comes after the autouse fixture's
        # revert(), which would load this plugin into the catalog again.
        sys.path.insert(0, str(root))
        importlib.invalidate_caches()
        roots.append(str(root))
        packages.append(package)
        catalog.reload()
        return package

    yield make
    revert()  # while the plugins' entries are still in the catalog
    for root in roots:
        sys.path.remove(root)
    importlib.invalidate_caches()
    catalog.reload()
    for name in [n for n in sys.modules if n.split(".")[0] in packages]:
        del sys.modules[name]


@pytest.fixture(scope="module", autouse=True)
def _one_child_per_question() -> Iterator[None]:
    """#6964's sniff imports megatron's attention module in child interpreters (two per
    probe), #6890's runs the rope kernels in one (seconds of CPU each); their in-process
    memos and the proof store's key follow ``sys.path``, which every plugin made here
    extends, so each test would start them again. The folders these tests add hold only
    ``plugin_acme_*`` packages and ``acme-*`` distributions, which those children (the
    backports off there) never reach: each child's answer is computed once for this file."""
    real_import = megatron_lm_6964.import_in_child
    real_kernels = megatron_lm_6890.kernels_in_child
    seen: dict[str, object] = {}

    def once(key: str, compute: Callable[[], object]) -> Any:
        if key not in seen:
            seen[key] = compute()
        return json.loads(json.dumps(seen[key]))  # a fresh copy for each caller

    def import_once(guard: Callable[..., object], first_on_path: Path) -> Any:
        key = f"6964 {guard.__module__}.{guard.__qualname__}"
        return once(key, lambda: real_import(guard, first_on_path))

    def kernels_once(sets: dict[str, object]) -> Any:
        return once(f"6890 {json.dumps(sets, sort_keys=True)}", lambda: real_kernels(sets))

    with pytest.MonkeyPatch.context() as patch:
        swap_keeping_answers(patch, megatron_lm_6964, "import_in_child", import_once)
        swap_keeping_answers(patch, megatron_lm_6890, "kernels_in_child", kernels_once)
        yield


BUILTINS = [spec.id for spec in catalog.CATALOG]


def ids() -> list[str]:
    return [spec.id for spec in catalog.entries()]


def withheld() -> dict[str, Withheld]:
    return {w.id: w for w in catalog.withheld()}


def test_an_entry_point_naming_one_entry_joins_the_catalog(make_plugin: MakePlugin) -> None:
    make_plugin("acme-one", {"acme-1": "VALUE = clone('acme-1')"}, version="2.3")
    assert ids() == [*BUILTINS, "acme-1"]
    assert catalog.source("acme-1") == "acme-one 2.3"
    assert catalog.source(BACKPORT_ID) == "builtin"
    assert catalog.by_id("acme-1").vendored == MEGATRON_LM_7617.vendored
    assert withheld() == {}


def test_an_entry_point_naming_an_iterable_adds_each(make_plugin: MakePlugin) -> None:
    make_plugin("acme-two", {"acme": "VALUE = (clone(i) for i in ('acme-a', 'acme-b'))"})
    assert ids() == [*BUILTINS, "acme-a", "acme-b"]
    assert catalog.select(["acme-b"]) == [catalog.by_id("acme-b")]


def test_the_entry_points_are_read_once_per_process_and_lazily(
    make_plugin: MakePlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_plugin("acme-one", {"acme-1": "VALUE = clone('acme-1')"})
    reads: list[object] = []
    real = importlib.metadata.entry_points

    def counting(**kwargs: object) -> object:
        reads.append(kwargs)
        return real(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.metadata, "entry_points", counting)
    catalog.reload()
    assert reads == []  # nothing is read before the catalog is used
    for _ in range(3):
        catalog.entries()
        catalog.select(None)
        catalog.source("acme-1")
        catalog.withheld()
    assert reads == [{"group": GROUP}]


def test_a_plugin_that_fails_to_import_is_one_incompatible_record(
    make_plugin: MakePlugin,
) -> None:
    make_plugin("acme-broken", {"acme-broken": "raise RuntimeError('no GPU here')"})
    make_plugin("acme-fine", {"acme-fine": "VALUE = clone('acme-fine')"})
    assert ids() == [*BUILTINS, "acme-fine"]  # the other plugin still loads
    (record,) = withheld().values()
    assert (record.id, record.verdict, record.source) == (
        "acme-broken",
        Verdict.INCOMPATIBLE,
        "acme-broken 1.0",
    )
    assert "acme-broken 1.0" in record.reason
    assert "RuntimeError: no GPU here" in record.reason


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("VALUE = 7617", "names a int"),
        ("VALUE = 'acme-1'", "names a str"),
        ("VALUE = [clone('acme-ok'), object()]", "item 1 is a object"),
        ("VALUE = []", "empty"),
        ("VALUE = [clone('acme-x'), clone('acme-x')]", "acme-x more than once"),
        (
            "def _gen():\n    yield clone('acme-ok')\n    raise OSError('disk')\nVALUE = _gen()",
            "disk",
        ),
        ("", "has no attribute 'VALUE'"),
    ],
)
def test_a_plugin_naming_what_is_not_an_entry_contributes_nothing(
    make_plugin: MakePlugin, body: str, says: str
) -> None:
    make_plugin("acme-odd", {"acme-odd": body})
    assert ids() == BUILTINS  # not even the good item of a bad iterable
    record = withheld()["acme-odd"]
    assert record.verdict is Verdict.INCOMPATIBLE
    assert "acme-odd 1.0" in record.reason and says in record.reason


def test_a_plugin_claiming_a_builtin_id_is_withheld_never_the_builtin(
    make_plugin: MakePlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEGATRON_BACKPORTS_ALLOW_BUILTIN_IDS", "acme-dup")  # the prefix allowed
    catalog.reload()
    make_plugin("acme-dup", {"acme": f"VALUE = [clone('{BACKPORT_ID}'), clone('acme-sib')]"})
    assert ids() == BUILTINS  # the builtin keeps its id; the plugin contributes nothing
    assert catalog.source(BACKPORT_ID) == "builtin"
    (record,) = withheld().values()
    assert (record.id, record.verdict) == ("acme", Verdict.INCOMPATIBLE)
    assert BACKPORT_ID in record.reason and "acme-dup 1.0" in record.reason
    assert "builtin" in record.reason and "\n" not in record.reason


@pytest.mark.parametrize("allowed", ["", "other-dist", "acme-prefix"])
def test_a_plugin_id_with_the_builtin_prefix_needs_the_users_leave(
    make_plugin: MakePlugin, monkeypatch: pytest.MonkeyPatch, allowed: str
) -> None:
    monkeypatch.setenv("MEGATRON_BACKPORTS_ALLOW_BUILTIN_IDS", allowed)
    catalog.reload()
    make_plugin("acme-prefix", {"acme": "VALUE = [clone('megatron-lm-99999'), clone('acme-2')]"})
    if allowed == "acme-prefix":
        assert ids() == [*BUILTINS, "megatron-lm-99999", "acme-2"]
        return
    assert ids() == BUILTINS
    (record,) = withheld().values()
    assert "megatron-lm-99999" in record.reason
    assert "MEGATRON_BACKPORTS_ALLOW_BUILTIN_IDS=acme-prefix" in record.reason


def test_two_plugins_claiming_one_id(make_plugin: MakePlugin) -> None:
    make_plugin("acme-a", {"x": "VALUE = clone('acme-same')"})
    make_plugin("acme-b", {"y": "VALUE = clone('acme-same')"})
    assert ids() == BUILTINS
    (record,) = withheld().values()
    assert record.id == "acme-same"
    assert "acme-a 1.0" in record.reason and "acme-b 1.0" in record.reason


def test_a_skipped_distribution_is_never_imported(
    make_plugin: MakePlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = make_plugin("Acme-Broken", {"acme-broken": "raise SystemExit('imported!')"})
    monkeypatch.setenv("MEGATRON_BACKPORTS_SKIP_PLUGINS", " other, acme_broken ")
    catalog.reload()
    assert ids() == BUILTINS
    record = withheld()["acme-broken"]
    assert (record.verdict, record.source) == (Verdict.DISABLED, "Acme-Broken 1.0")
    assert "MEGATRON_BACKPORTS_SKIP_PLUGINS" in record.reason
    assert not [name for name in sys.modules if name.startswith(package)]


def test_a_failed_plugins_id_never_hides_a_loaded_entry(make_plugin: MakePlugin) -> None:
    make_plugin("acme-broken", {BACKPORT_ID: "raise ImportError('gone')"})
    assert ids() == BUILTINS
    assert set(withheld()) == {f"acme-broken:{BACKPORT_ID}"}


@pytest.mark.usefixtures("tilelang_dsa")
def test_status_json_names_each_source(
    make_plugin: MakePlugin, capsys: pytest.CaptureFixture[str]
) -> None:
    make_plugin("acme-one", {"acme-1": "VALUE = clone('acme-1')"}, version="2.3")
    make_plugin("acme-broken", {"acme-broken": "import not_a_module_anywhere"})
    assert cli.main(["status", "--json"]) == 0
    reports = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert {i: (r["verdict"], r["source"]) for i, r in reports.items()} == {
        **{i: ("needed", "builtin") for i in BUILTINS},
        # On #7617's own target, which the builtin patches first (see the shadowing test).
        "acme-1": ("incompatible", "acme-one 2.3"),
        "acme-broken": ("incompatible", "acme-broken 1.0"),
    }
    assert "ModuleNotFoundError" in reports["acme-broken"]["reason"]


@pytest.mark.usefixtures("tilelang_dsa")
def test_apply_installs_plugins_and_warns_once_for_a_broken_one(
    make_plugin: MakePlugin,
) -> None:
    make_plugin("acme-one", {"acme-1": "VALUE = clone('acme-1')"})
    make_plugin("acme-broken", {"acme-broken": "VALUE = 1"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reports = {r.id: r for r in apply(["acme-1", "acme-broken"])}
        apply(["acme-broken"])
    assert str(reports["acme-1"].action) == "installed"
    assert reports["acme-1"].source == "acme-one 1.0"
    assert reports["acme-broken"].verdict is Verdict.INCOMPATIBLE
    messages = [str(w.message) for w in caught if w.category is BackportWarning]
    assert len(messages) == 1 and "acme-broken 1.0" in messages[0]
    assert caught[0].filename == __file__  # points at the caller of apply()
    with pytest.raises(Exception, match="acme-broken is incompatible"):
        apply(["acme-broken"], strict=True)


@pytest.mark.usefixtures("tilelang_dsa")
def test_check_fails_on_a_broken_plugin_and_passes_once_it_is_skipped(
    make_plugin: MakePlugin, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_plugin("acme-broken", {"acme-broken": "raise ValueError('bad')"})
    assert cli.main(["check"]) == 1
    assert "acme-broken" in capsys.readouterr().out
    monkeypatch.setenv("MEGATRON_BACKPORTS_SKIP_PLUGINS", "acme-broken")
    catalog.reload()
    assert cli.main(["check"]) == 0


def test_status_of_a_withheld_id_alone_probes_nothing(make_plugin: MakePlugin) -> None:
    make_plugin("acme-broken", {"acme-broken": "VALUE = None"})
    (report,) = status("acme-broken")
    assert (report.id, report.verdict, report.source) == (
        "acme-broken",
        Verdict.INCOMPATIBLE,
        "acme-broken 1.0",
    )
    with pytest.raises(Exception, match=r"known: .*acme-broken"):
        status("acme-nope")


def test_help_lists_plugin_entries_and_the_skip_switch(
    make_plugin: MakePlugin, capsys: pytest.CaptureFixture[str]
) -> None:
    make_plugin("acme-one", {"acme-1": "VALUE = clone('acme-1')"}, version="2.3")
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "acme-1" in out and "[acme-one 2.3]" in out
    assert "MEGATRON_BACKPORTS_SKIP_PLUGINS=DIST" in out


def test_the_start_up_hook_watches_plugin_targets(make_plugin: MakePlugin) -> None:
    body = """
    base = clone('acme-lib')
    target = dataclasses.replace(base.target, modules=('acme_lib.kernels',))
    VALUE = dataclasses.replace(base, targets=(target,))
    """
    make_plugin("acme-lib", {"acme-lib": body})
    assert "acme_lib.kernels" in job_start.target_modules()
    assert job_start.target_modules(("acme-lib",)) == ("acme_lib.kernels",)
    # megatron_fsdp: megatron-lm-5976 carries the megatron-fsdp wheel's copy too.
    assert job_start.watched_packages() == ("megatron", "megatron_fsdp", "acme_lib")
    assert "acme_lib" in job_start.hook_text()


# ---- reliability round 3 (issue 24) -----------------------------------------------------------

UPGRADABLE = """
from packaging.version import Version
from backports.megatron.catalog import SniffResult

FIXED = {fixed}

def sniff(targets):
    # The vendored replacement (sniffed too) has the fix; megatron's own function: FIXED.
    installed = (targets[0].original.__module__ or "").startswith("megatron.")
    fixed = FIXED if installed else True
    return SniffResult(fixed=fixed, summary=f"acme's sniff says fixed={{fixed}}")

# Version 1.1 records the installed release as carrying the fix: a fixed sniff alone is
# "drifted", never "upstream".
FIXED_IN = Version("0.19.2") if FIXED else None
VALUE = dataclasses.replace(MEGATRON_LM_7617, id="acme-up", sniff=sniff, fixed_in=FIXED_IN)
"""


def _upgrade(package: str, root: Path, dist: str, old: str, new: str, body: str) -> None:
    """Install a new version of a plugin in place: new code, new dist-info version."""
    (root / package / "entry0.py").write_text(CLONES + textwrap.dedent(body))
    info = root / f"{dist.replace('-', '_')}-{old}.dist-info"
    metadata = (info / "METADATA").read_text().replace(f"Version: {old}", f"Version: {new}")
    (info / "METADATA").write_text(metadata)
    info.rename(root / f"{dist.replace('-', '_')}-{new}.dist-info")
    for name in [n for n in sys.modules if n.split(".")[0] == package]:
        del sys.modules[name]
    importlib.invalidate_caches()
    catalog.reload()


@pytest.mark.usefixtures("tilelang_dsa")
def test_a_plugin_upgrade_is_probed_again_not_served_from_the_cache(
    make_plugin: MakePlugin, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE", "1")
    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE_DIR", str(tmp_path / "cache"))
    package = make_plugin("acme-up", {"acme-up": UPGRADABLE.format(fixed=False)})
    (first,) = apply("acme-up")
    assert first.verdict is Verdict.NEEDED and first.evidence["cache"]["hit"] is False
    revert("acme-up")
    (again,) = apply("acme-up")  # the control: the same plugin reuses its verdict
    assert again.evidence["cache"]["hit"] is True
    revert("acme-up")
    _upgrade(package, tmp_path / package, "acme-up", "1.0", "1.1", UPGRADABLE.format(fixed=True))
    with pytest.warns(BackportWarning, match="fixed=True"):
        (upgraded,) = apply("acme-up")
    assert upgraded.verdict is Verdict.UPSTREAM and upgraded.evidence["cache"]["hit"] is False


@pytest.mark.parametrize(
    "body",
    [
        "raise SystemExit(2)",  # argparse at module level, given the job's argv
        "import argparse\nargparse.ArgumentParser().parse_args(['--lr', '3e-4'])",
        "raise GeneratorExit()",
    ],
    ids=["SystemExit", "argparse", "GeneratorExit"],
)
@pytest.mark.usefixtures("tilelang_dsa")
def test_a_plugin_raising_a_base_exception_at_import_is_withheld(
    make_plugin: MakePlugin, body: str, capsys: pytest.CaptureFixture[str]
) -> None:
    make_plugin("acme-exits", {"acme-exits": body})
    assert ids() == BUILTINS
    record = withheld()["acme-exits"]
    assert record.verdict is Verdict.INCOMPATIBLE and "acme-exits 1.0" in record.reason
    assert "\n" not in record.reason
    reports = {r.id: r for r in apply(BACKPORT_ID)}
    assert str(reports[BACKPORT_ID].action) == "installed"
    assert cli.main(["status"]) == 0


@pytest.mark.usefixtures("tilelang_dsa")
def test_a_plugin_sniff_raising_system_exit_is_incompatible_not_the_end(
    make_plugin: MakePlugin,
) -> None:
    body = """
    def sniff(targets):
        raise SystemExit("sniffing exits")

    VALUE = dataclasses.replace(MEGATRON_LM_7617, id="acme-sniff", sniff=sniff)
    """
    make_plugin("acme-sniff", {"acme-sniff": body})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reports = {r.id: r for r in apply()}
    assert reports["acme-sniff"].verdict is Verdict.INCOMPATIBLE
    assert "SystemExit: sniffing exits" in reports["acme-sniff"].reason
    assert str(reports[BACKPORT_ID].action) == "installed"
    (probed,) = status("acme-sniff")
    assert probed.verdict is Verdict.INCOMPATIBLE


def test_a_plugin_raising_keyboard_interrupt_itself_is_withheld_not_the_end(
    make_plugin: MakePlugin,
) -> None:
    """No SIGINT arrived: the KeyboardInterrupt is the plugin's own (issue 42), a broken
    plugin like any other; the builtins and another plugin keep working."""
    make_plugin("acme-ctrl-c", {"acme-ctrl-c": "raise KeyboardInterrupt"})
    make_plugin("acme-fine", {"acme-fine": "VALUE = clone('acme-fine')"})
    assert ids() == [*BUILTINS, "acme-fine"]
    record = withheld()["acme-ctrl-c"]
    assert record.verdict is Verdict.INCOMPATIBLE and "acme-ctrl-c 1.0" in record.reason
    assert ": KeyboardInterrupt; it contributes nothing" in record.reason


def test_the_users_ctrl_c_during_a_plugins_import_still_stops(
    make_plugin: MakePlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGINT arriving while the plugin imports (as from the terminal): it goes through,
    and the SIGINT handler is the one it was before."""
    body = "import signal\nsignal.raise_signal(signal.SIGINT)\nVALUE = clone('acme-slow')"
    make_plugin("acme-slow", {"acme-slow": body})
    # Python's own handler, as in a terminal (a shell's background job starts with SIGINT
    # ignored, and then Python installs none).
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            catalog.entries()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)
    monkeypatch.setenv("MEGATRON_BACKPORTS_SKIP_PLUGINS", "acme-slow")  # for the teardown
    catalog.reload()


def test_a_keyboard_interrupt_off_the_main_thread_is_never_the_users(
    make_plugin: MakePlugin,
) -> None:
    """Python raises a SIGINT's KeyboardInterrupt in the main thread only: catalog loaded
    from another thread (a job's own loader thread) withholds the plugin."""
    make_plugin("acme-ctrl-c", {"acme-ctrl-c": "raise KeyboardInterrupt"})
    seen: list[object] = []
    worker = threading.Thread(target=lambda: seen.append(withheld()))
    worker.start()
    worker.join(timeout=60)
    (records,) = seen
    assert "acme-ctrl-c" in records  # type: ignore[operator]


def test_a_slow_plugin_import_is_said_while_it_runs_and_still_loads(
    make_plugin: MakePlugin, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_plugins, "SLOW_IMPORT_S", 0.05)
    make_plugin("acme-slow", {"acme-slow": "import time\ntime.sleep(0.5)\nVALUE = clone('acme-s')"})
    assert ids() == [*BUILTINS, "acme-s"]
    err = capfd.readouterr().err
    assert err == (
        "backports: warning: importing entry point 'acme-slow' of acme-slow 1.0 has taken over "
        "0.05 s and goes on (it runs at every job start; "
        "MEGATRON_BACKPORTS_SKIP_PLUGINS=acme-slow leaves it out)\n"
    )


def test_a_quick_plugin_import_says_nothing(
    make_plugin: MakePlugin, capfd: pytest.CaptureFixture[str]
) -> None:
    make_plugin("acme-quick", {"acme-quick": "VALUE = clone('acme-q')"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ids() == [*BUILTINS, "acme-q"]
    assert capfd.readouterr().err == ""
    assert not [t for t in threading.enumerate() if isinstance(t, threading.Timer)]


_THREADING = """
import threading
STOP = threading.Event()
threading.Thread(target=STOP.wait, name="acme-telemetry", daemon={daemon}).start()
VALUE = clone('acme-t')
"""


def test_a_plugin_starting_a_non_daemon_thread_at_import_is_named(
    make_plugin: MakePlugin,
) -> None:
    """Such a thread keeps the interpreter at its exit: said in one warning, naming the
    plugin, the thread and the switch; the plugin's entries still load."""
    package = make_plugin("acme-threads", {"acme-threads": _THREADING.format(daemon=False)})
    try:
        with pytest.warns(BackportWarning) as caught:
            assert ids() == [*BUILTINS, "acme-t"]
    finally:
        sys.modules[f"{package}.entry0"].STOP.set()
    (said,) = [str(w.message) for w in caught]
    assert said.startswith("entry point 'acme-threads' of acme-threads 1.0 started thread(s) ")
    assert "'acme-telemetry'" in said and "MEGATRON_BACKPORTS_SKIP_PLUGINS=acme-threads" in said


def test_a_daemon_thread_started_at_import_is_no_warning(make_plugin: MakePlugin) -> None:
    package = make_plugin("acme-threads", {"acme-threads": _THREADING.format(daemon=True)})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert ids() == [*BUILTINS, "acme-t"]
    finally:
        sys.modules[f"{package}.entry0"].STOP.set()


def _bad(change: str) -> str:
    return f"""
    from packaging.version import Version
    from backports.megatron.catalog import Target, VendoredRef
    base = MEGATRON_LM_7617
    target = base.target
    VALUE = [clone("acme-good"), dataclasses.replace(base, id="acme-bad", {change})]
    """


_BAD_FIELDS = [
    ("target_since='0.19'", "target_since"),
    ("fixed_in='0.20'", "fixed_in"),
    ("targets=(dataclasses.replace(target, modules=()),)", "modules"),
    ("targets=(dataclasses.replace(target, modules=('',)),)", "modules"),
    ("targets=(dataclasses.replace(target, modules='megatron.core'),)", "modules"),
    ("targets=(dataclasses.replace(target, parameters='query, key'),)", "parameters"),
    ("targets=(dataclasses.replace(target, attribute=''),)", "attribute"),
    ("targets=(dataclasses.replace(target, distribution=None),)", "distribution"),
    ("targets=(dataclasses.replace(target, helpers=('SparseMLA', 3)),)", "helpers"),
    ("targets=(dataclasses.replace(target, decorator='no_colon'),)", "decorator"),
    ("targets=[target]", "targets"),
    ("targets=(target, 'x')", "targets"),
    ("sniff=None", "sniff"),
    ("vendored='backports.megatron._vendor'", "vendored"),
    ("vendored=VendoredRef('no such package', 'm', 'a')", "vendored.package"),
    ("title=None", "title"),
    ("delete_when_landed=1", "delete_when_landed"),
    ("local_changes=(object(),)", "local_changes"),
    ("id=''", "id"),
    ("id='acme bad'", "id"),
]


@pytest.mark.parametrize(("change", "field"), _BAD_FIELDS)
def test_a_plugin_entry_with_a_bad_field_is_withheld_naming_it(
    make_plugin: MakePlugin, change: str, field: str
) -> None:
    make_plugin("acme-bad", {"acme-bad": _bad(change)})
    make_plugin("acme-fine", {"acme-fine": "VALUE = clone('acme-fine')"})
    assert ids() == [*BUILTINS, "acme-fine"]
    record = withheld()["acme-bad"]
    assert record.verdict is Verdict.INCOMPATIBLE
    assert field in record.reason and "acme-bad 1.0" in record.reason
    assert "\n" not in record.reason


# What the commands do beside an entry withheld at loading does not depend on which field
# made it bad (each field's record is checked above): one case runs in the fast selection.
_ONE_FIELD_IS_ENOUGH = pytest.mark.slow(
    reason="apply/status/check beside a withheld entry: the same for every bad field; "
    "the fast selection runs the first"
)


@pytest.mark.parametrize(
    ("change", "field"),
    [_BAD_FIELDS[0], *(pytest.param(*c, marks=_ONE_FIELD_IS_ENOUGH) for c in _BAD_FIELDS[1:])],
)
@pytest.mark.usefixtures("tilelang_dsa")
def test_beside_a_bad_plugin_entry_every_backport_installs_and_check_fails(
    make_plugin: MakePlugin, change: str, field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    make_plugin("acme-bad", {"acme-bad": _bad(change)})
    make_plugin("acme-fine", {"acme-fine": "VALUE = clone('acme-fine')"})
    assert ids() == [*BUILTINS, "acme-fine"] and field in withheld()["acme-bad"].reason
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reports = {r.id: r for r in apply()}  # explicit apply(): every other backport installs
    assert {str(reports[i].action) for i in BUILTINS} <= {"installed", "deferred"}
    assert str(reports[BACKPORT_ID].action) == "installed"
    assert "acme-fine" in reports  # judged (on 7617's target: refused as a foreign patch)
    revert()
    capsys.readouterr()
    assert cli.main(["status"]) == 0
    assert cli.main(["check"]) == 1  # the bad plugin fails the gate; nothing raises
    out = capsys.readouterr().out
    assert "acme-bad" in out and "Traceback" not in out


@pytest.mark.usefixtures("tilelang_dsa")
def test_status_says_a_plugin_entry_shadowing_a_builtins_target_never_installs(
    make_plugin: MakePlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_plugin("acme-shadow", {"acme-shadow": "VALUE = clone('acme-shadow')"})
    reports = {r.id: r for r in status()}
    assert str(reports[BACKPORT_ID].action) == "would-install"
    shadow = reports["acme-shadow"]
    assert (shadow.verdict, str(shadow.action)) == (Verdict.INCOMPATIBLE, "would-skip")
    assert BACKPORT_ID in shadow.reason and "fused_sparse_mla_absorbed" in shadow.reason
    # --only judges it as a job would: beside the builtin it never installs, so status
    # --only says so and check --only fails (not "needed", not green).
    (alone,) = status("acme-shadow")
    assert (alone.id, alone.verdict, alone.action, alone.reason) == (
        shadow.id,
        shadow.verdict,
        shadow.action,
        shadow.reason,
    )
    assert cli.main(["check", "--only", "acme-shadow"]) == 1
    with warnings.catch_warnings():  # what apply() does agrees
        warnings.simplefilter("ignore")
        applied = {r.id: r for r in apply()}
    assert applied["acme-shadow"].verdict is Verdict.INCOMPATIBLE
    revert()
    monkeypatch.setenv("MEGATRON_BACKPORTS_SKIP", BACKPORT_ID)  # the builtin off: no conflict
    assert str({r.id: r for r in status()}["acme-shadow"].action) == "would-install"


@pytest.mark.parametrize("command", ["status", "check"])
@pytest.mark.usefixtures("tilelang_dsa")
def test_json_output_stays_json_whatever_a_sniff_puts_in_its_detail(
    make_plugin: MakePlugin, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    body = """
    from backports.megatron.catalog import SniffResult

    class Opaque:
        def __repr__(self):
            return "<Opaque>"

    def sniff(targets):
        detail = {"obj": Opaque(), "ids": {3}, "nan": float("nan"), 7: b"raw"}
        installed = (targets[0].original.__module__ or "").startswith("megatron.")
        return SniffResult(fixed=not installed, summary="odd detail", detail=detail)

    VALUE = dataclasses.replace(MEGATRON_LM_7617, id="acme-odd-json", sniff=sniff)
    """
    make_plugin("acme-odd-json", {"acme-odd-json": body})
    cli.main([command, "--json", "--only", "acme-odd-json"])
    out = capsys.readouterr().out
    (report,) = json.loads(out, parse_constant=lambda name: pytest.fail(f"not JSON: {name}"))
    behaviour = report["evidence"]["behaviour"]
    assert behaviour["obj"] == "<Opaque>" and behaviour["ids"] == "{3}"
    assert behaviour["nan"] == "nan" and behaviour["7"] == "b'raw'"
