"""Shared fixtures: the real megatron-core 0.19.2 module, a fake kernel, clean state."""

import functools
import importlib
import importlib.metadata
import os
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from backports.megatron import revert
from backports.megatron.session import SESSION
from backports.megatron.testing.fake_kernel import FakeSparseMLA

TILELANG_DSA = "megatron.core.transformer.experimental_attention_variant.ops.tilelang_dsa"
BACKPORT_ID = "megatron-lm-7617"


@pytest.fixture(scope="session")
def tilelang_dsa() -> ModuleType:
    """The real, installed megatron-core module (imported once: it takes seconds)."""
    return importlib.import_module(TILELANG_DSA)


@pytest.fixture
def fake_kernel(tilelang_dsa: ModuleType, monkeypatch: pytest.MonkeyPatch) -> FakeSparseMLA:
    """Replace only the TileLang kernel; everything else is the real megatron-core."""
    kernel = FakeSparseMLA()
    # #7617's sniff calls a copy of the function with a recorder of its own: no proof
    # depends on which kernel the module holds.
    swap_keeping_answers(monkeypatch, tilelang_dsa, "SparseMLA", kernel)
    return kernel


@functools.cache
def environment_plugins() -> frozenset[str]:
    """Distributions installed in this environment that register catalog entries: a user's
    plugin (``backports new`` tells its author to install it into the job's venv)."""
    from packaging.utils import canonicalize_name

    from backports.megatron.catalog._plugins import GROUP

    return frozenset(
        canonicalize_name(ep.dist.name)
        for ep in importlib.metadata.entry_points(group=GROUP)
        if ep.dist is not None
    )


@pytest.fixture(scope="session")
def _environment_plugins() -> frozenset[str]:
    return environment_plugins()


def _skip_switch(plugins: frozenset[str]) -> tuple[str, str]:
    from backports.megatron.switches import SKIP_PLUGINS

    return SKIP_PLUGINS, ",".join(sorted(plugins))


def skip_environment_plugins() -> dict[str, str]:
    """For a child process whose environment a test writes itself: the switch that leaves
    the plugins installed in this environment unimported ({} when there are none). Its
    skipped distributions still show as ``disabled`` rows: compare builtin rows only."""
    plugins = environment_plugins()
    return dict([_skip_switch(plugins)]) if plugins else {}


def builtin_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``--json`` rows of builtin entries (a user's plugin in the venv adds its own)."""
    return [row for row in rows if row.get("source") == "builtin"]


def _path_state() -> tuple[tuple[str, int], ...]:
    """``sys.path`` with each folder's mtime: adding or removing a distribution (a
    ``.dist-info`` folder: pip, or a test's ``make_plugin``) changes its folder's mtime."""
    state = []
    for folder in sys.path:
        try:
            state.append((folder, os.stat(folder or ".").st_mtime_ns))
        except OSError:
            state.append((folder, -1))
    return tuple(state)


@pytest.fixture(scope="session", autouse=True)
def _entry_points_read_once_per_path() -> Iterator[None]:
    """The catalog's plugins are loaded once per process in a job; every test starts a new
    session (``SESSION.reset()``) and would read every distribution's entry points again
    (~30 ms, ~2,000 tests). The listing of the plugins' group is kept while ``sys.path``
    and its folders are unchanged; any other call reads afresh."""
    from backports.megatron.catalog._plugins import GROUP

    real = importlib.metadata.entry_points
    kept: dict[tuple[tuple[str, int], ...], Any] = {}

    @functools.wraps(real)
    def entry_points(**params: Any) -> Any:
        if params != {"group": GROUP}:
            return real(**params)
        state = _path_state()
        if state not in kept:
            kept.clear()
            kept[state] = real(**params)
        return kept[state]

    importlib.metadata.entry_points = entry_points  # type: ignore[assignment]
    try:
        yield
    finally:
        importlib.metadata.entry_points = real


@pytest.fixture(autouse=True)
def _builtins_and_the_tests_own_plugins(
    monkeypatch: pytest.MonkeyPatch, _environment_plugins: frozenset[str]
) -> Iterator[None]:
    """The catalog of each test: the builtins and the plugins the test makes itself.

    The tests assert what the builtin entries do; a user's plugin installed in the same
    venv (its stub sniff says ``incompatible``, its warnings add lines) is not theirs to
    judge, so its entry points are hidden from them (tests/catalog/test_plugin_entries.py
    builds its own).
    """
    if not _environment_plugins:
        yield
        return
    # The processes a test starts inherit this: they leave the user's plugin unimported too
    # (a test writing its child's environment from scratch adds skip_environment_plugins()).
    monkeypatch.setenv(*_skip_switch(_environment_plugins))
    from packaging.utils import canonicalize_name

    from backports.megatron import catalog
    from backports.megatron.catalog._plugins import GROUP

    real = importlib.metadata.entry_points

    def entry_points(**params: Any) -> importlib.metadata.EntryPoints:
        found = real(**params)
        if params.get("group") != GROUP:
            return found
        return importlib.metadata.EntryPoints(
            ep
            for ep in found
            if ep.dist is None or canonicalize_name(ep.dist.name) not in _environment_plugins
        )

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    catalog.reload()
    yield
    catalog.reload()


# ---- one proof store for the session (issue 43, item 2) -------------------------------------
# A status() or apply() proves every builtin entry; #6964's import-guard children and #6890's
# Triton child take seconds each. With the store off in every test, each test paid them
# again. The tests share one store for the session instead (a temporary folder, the cache
# on): each proof is made once. A stored proof serves a test only where it proves what the
# test would have found by itself; probed without the store, as before, are
# - every entry of a test marked ``private_proofs`` (the store off): the tests of the store,
#   of the sniffs' children, and any test that counts what a probe runs;
# - an entry the test built itself under a builtin's id (another sniff: ``dataclasses.replace``)
#   or under an id of its own that no plugin loaded (``probe(spec)`` of a made-up entry);
# - every entry while something is swapped in memory through a ``MonkeyPatch`` (an attribute,
#   a dict item other than an environment variable, ``sys.path``): the key covers files and the
#   targets' code, never a sniff or a helper replaced in memory. (An attribute of megatron's
#   own modules leaves the entries sniffed in child interpreters served: a child imports
#   megatron afresh.)
# A plugin's entry is keyed by its plugin's code and shared like a builtin. A test that swaps
# something by plain assignment and then probes uses monkeypatch or the marker.

_MONKEYPATCHES: "weakref.WeakSet[pytest.MonkeyPatch]" = weakref.WeakSet()


# Swaps that keep every answer: the user's plugins hidden (a plugin's entry is keyed by its
# own code), and each value ``swap_keeping_answers`` put in place (a memo of a child's answer).
_SAME_ANSWERS: dict[tuple[int, str], tuple[object, object]] = {}


def swap_keeping_answers(patch: pytest.MonkeyPatch, obj: object, name: str, value: object) -> None:
    """``patch.setattr(obj, name, value)`` for a ``value`` that answers as the original
    does (a memo of what a child said): the session's shared proofs keep serving."""
    patch.setattr(obj, name, value)
    _SAME_ANSWERS[id(obj), name] = (obj, value)


def _keeps_answers(obj: object, name: str) -> bool:
    if obj is importlib.metadata and name == "entry_points":
        return True
    known = _SAME_ANSWERS.get((id(obj), name))
    return known is not None and known[0] is obj and getattr(obj, name, None) is known[1]


def _of_megatron(obj: object) -> bool:
    """A megatron module, or a class or function one defines."""
    name = obj.__name__ if isinstance(obj, ModuleType) else getattr(obj, "__module__", None)
    return isinstance(name, str) and (name == "megatron" or name.startswith("megatron."))


def swapped_in_memory(in_child: bool = False) -> str | None:
    """What a live MonkeyPatch has swapped that a stored proof could not know of, or None.

    ``in_child``: the entry's sniff runs in child interpreters, which import megatron
    afresh and never see what this process swapped in megatron's modules (the key covers
    the targets' code and files); a swap of anything else (this package's code, ``sys``,
    ``subprocess``) still counts."""
    for patch in list(_MONKEYPATCHES):
        for obj, name, _ in patch._setattr:
            if not _keeps_answers(obj, name) and not (in_child and _of_megatron(obj)):
                return f"{getattr(obj, '__name__', type(obj).__name__)}.{name}"
        for mapping, name, _ in patch._setitem:
            if mapping is not os.environ:
                return f"item {name!r}"
        if patch._savesyspath is not None:
            return "sys.path"
    return None


@pytest.fixture(scope="session")
def shared_proof_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the session's proof store."""
    return tmp_path_factory.mktemp("proof-store")


@pytest.fixture(scope="session")
def _session_proofs(shared_proof_store: Path) -> Iterator[None]:
    """Proofs from the shared store only for what the test did not change (see above)."""
    from backports.megatron import catalog
    from backports.megatron.decision import verdict_cache

    builtins = {spec.id: spec for spec in catalog.CATALOG}
    real_key = verdict_cache.key
    real_init = pytest.MonkeyPatch.__init__

    def tracked_init(self: pytest.MonkeyPatch) -> None:
        real_init(self)
        _MONKEYPATCHES.add(self)

    def key(spec: Any, *args: Any, **kwargs: Any) -> dict[str, object] | None:
        found = real_key(spec, *args, **kwargs)
        if found is None or os.environ.get(verdict_cache.CACHE_DIR) != str(shared_proof_store):
            return found  # a test's own store: its own business
        if kwargs.get("plugin") is None and builtins.get(spec.id) != spec:
            return None  # an entry the test built: its sniff is no part of the key
        if swapped_in_memory(in_child=kwargs.get("child_path") is not None) is not None:
            return None
        return found

    with pytest.MonkeyPatch.context() as patch:
        # Not tracked itself: it is made before tracked_init is in place.
        patch.setattr(pytest.MonkeyPatch, "__init__", tracked_init)
        patch.setattr(verdict_cache, "key", key)
        yield


@pytest.fixture
def _proof_store_of_the_test(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, shared_proof_store: Path
) -> None:
    if request.node.get_closest_marker("private_proofs"):
        monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE", "0")
        return
    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE", "1")
    monkeypatch.setenv("MEGATRON_BACKPORTS_CACHE_DIR", str(shared_proof_store))


@pytest.fixture(autouse=True)
def _no_backport_leaks(
    monkeypatch: pytest.MonkeyPatch, _session_proofs: None, _proof_store_of_the_test: None
) -> Iterator[None]:
    """Each test starts and ends with nothing installed and no pending hook."""
    monkeypatch.delenv("MEGATRON_BACKPORTS", raising=False)
    monkeypatch.delenv("MEGATRON_BACKPORTS_SKIP", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    # Warnings an earlier test gave would silence this test's as a parent's would a child's.
    monkeypatch.setenv("MEGATRON_BACKPORTS_SAID", "")
    monkeypatch.delenv("MEGATRON_BACKPORTS_SAID")
    revert()
    SESSION.reset()  # a new session per test: nothing installed, watched, said or loaded
    handlers = _signal_handlers()
    yield
    revert()
    SESSION.reset()
    # A handler left behind would change what a later test's Ctrl-C or SIGTERM does (and a
    # user's, were it the tool that left it).
    assert _signal_handlers() == handlers, "the test left a signal handler changed"


def _signal_handlers() -> tuple[object, object]:
    import signal

    return signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[list[object]]:
    """Each scan for aliases the patcher makes, as the objects it looked for."""
    from backports.megatron.kinds import install

    seen: list[list[object]] = []
    real = install.bindings_of_each

    def counting(objs):  # type: ignore[no-untyped-def]
        seen.append(list(objs))
        return real(objs)

    monkeypatch.setattr(install, "bindings_of_each", counting)
    return seen


def ids_installed_by_importing(module: str) -> list[str]:
    """The catalog ids a process installs when its only megatron import is ``module``:
    every entry whose targets are all defined in modules that import brings in, and every
    import guard (installed before any megatron module runs). (An entry with a target
    elsewhere, as #6793's recompute / DSA pair, waits for its modules. An entry whose code
    ships in several distributions, ``copies``, is installed once one copy is all there.)"""
    return list(_ids_installed_by_importing(module))


@functools.cache
def _ids_installed_by_importing(module: str) -> tuple[str, ...]:
    """Asked of a child interpreter once per test process (it imports megatron: seconds)."""
    import subprocess
    import sys

    script = (
        f"import sys, {module}\n"
        "from backports.megatron.catalog import CATALOG\n"
        "from backports.megatron.kinds import kind_of\n"
        "print(' '.join(s.id for s in CATALOG if any(all(kind_of(t).before_import or "
        "any(m in sys.modules for m in t.modules) for t in part.targets) "
        "for part in s.parts())))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300
    )
    return tuple(sorted(done.stdout.split()))


# ---- what the default selection leaves out (tools/run-tests without --all) -------------------

_DESELECTED_SLOW: list[pytest.Item] = []


def pytest_deselected(items: list[pytest.Item]) -> None:
    _DESELECTED_SLOW.extend(item for item in items if item.get_closest_marker("slow"))


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    """Name the slow tests a ``-m "not slow"`` run left out, file by file: what was not run
    is said, not hidden in a count."""
    if not _DESELECTED_SLOW:
        return
    by_file: dict[str, dict[str, int]] = {}
    for item in _DESELECTED_SLOW:
        path, _, name = item.nodeid.partition("::")
        function = name.partition("[")[0]  # a parametrized test's cases under its name
        cases = by_file.setdefault(path, {})
        cases[function] = cases.get(function, 0) + 1
    write = terminalreporter.write_line
    write(f"not run: {len(_DESELECTED_SLOW)} slow tests (tools/run-tests --all runs them):")
    for path, cases in by_file.items():
        named = [f"{f} ({n} cases)" if n > 1 else f for f, n in cases.items()]
        write(f"  {path} ({sum(cases.values())}): {', '.join(named)}")


# ---- the user's real cache is never written (issue 36, item 2) ------------------------------
# Self-contained. For the whole session XDG_CACHE_HOME points at a temporary folder, so the
# sync's cache clones and the verdict cache's fallback land there (child processes inherit
# it, and a test's `monkeypatch.undo()` returns to it, never to the home); an audit hook
# records every write this process makes under the real cache folders as they were before
# the session (the home's and the original $XDG_CACHE_HOME's megatron-backports/), and the
# session fails if there is one.

_CACHE_WRITES: list[str] = []
_STORE = "MEGATRON_BACKPORTS_CACHE_DIR"
_WRITE_EVENTS = frozenset(
    {"open", "os.mkdir", "os.rename", "os.replace", "os.remove", "os.rmdir", "os.symlink",
     "os.link", "os.truncate", "os.chmod", "os.utime", "shutil.rmtree", "subprocess.Popen"}
)  # fmt: skip


def _real_cache_roots() -> tuple[str, ...]:
    import os

    roots = [os.path.join(os.path.expanduser("~"), ".cache")]
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        roots.append(xdg)
    return tuple(os.path.join(os.path.realpath(r), "megatron-backports") for r in roots)


def _written_paths(event: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The paths an audited event writes (or runs a command in); () for a read."""
    import os

    if event == "open":
        path, mode, flags = args
        writing = (
            any(c in mode for c in "wax+")
            if isinstance(mode, str)
            else bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC))
        )
        return (path,) if writing else ()
    if event == "subprocess.Popen":
        return (args[2],)  # its working directory: git runs inside a cache clone
    return (
        tuple(args[:2])
        if event in {"os.rename", "os.replace", "os.symlink", "os.link"}
        else (args[0],)
    )


@pytest.fixture(scope="session", autouse=True)
def _real_cache_untouched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    import os
    import sys

    roots = _real_cache_roots()

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if event not in _WRITE_EVENTS:
            return
        try:
            for path in _written_paths(event, args):
                if path is None or isinstance(path, int):
                    continue
                text = os.path.abspath(os.fsdecode(path))
                if any(text == root or text.startswith(root + os.sep) for root in roots):
                    _CACHE_WRITES.append(f"{event} {text}")
        except Exception:  # an audit hook must never break what it watches
            pass

    sys.addaudithook(audit)
    saved = {name: os.environ.get(name) for name in ("XDG_CACHE_HOME", _STORE)}
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    # Where a test's `monkeypatch.undo()` returns: never the venv's own proof store, which
    # `backports apply` (tools/run-job, the README's first command) fills in this venv.
    os.environ[_STORE] = str(tmp_path_factory.mktemp("no-tests-store"))
    # The start-up hook that command leaves in the venv armed a trigger in this process too:
    # each test starts without one, as in an environment without the hook.
    from backports.megatron.job import start_up

    start_up.deactivate()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    if _CACHE_WRITES:
        shown = "; ".join(dict.fromkeys(_CACHE_WRITES))
        pytest.fail(f"tests wrote to the user's real cache: {shown}", pytrace=False)


# ---- one run in random order (issue 36: no test may lean on another's leftovers) -----------


def pytest_collection_modifyitems(config, items: list[pytest.Item]) -> None:  # type: ignore[no-untyped-def]
    """``BACKPORTS_TEST_ORDER_SEED=N`` runs the selection in an order shuffled with seed N
    (printed in the header), to show no test depends on another's leftovers. Spread over
    workers (``tools/run-tests --all``), the longest files go first instead."""
    seed = os.environ.get("BACKPORTS_TEST_ORDER_SEED", "").strip()
    if seed:
        import random

        random.Random(seed).shuffle(items)
    elif os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=_longest_files_first)


# ---- the longest files first, when the tests are spread over workers ------------------------
# ``--dist loadfile --no-loadscope-reorder`` hands each worker one file at a time, in the order
# collected. A two-minute file handed out last keeps one worker busy while the other idles;
# handed out first, the short files fill in around it. Test-seconds of each file in a run of
# ``-m "slow and not gpu" -n 2`` on the 2-core machine (47 min at load ~5: setup, call and
# teardown of its slow tests); a file not named keeps its place after
# these. The figures only order the run: a stale one costs minutes, not a failure.
_FILE_SECONDS = {
    "tests/authoring/test_from_pr_command.py": 540,
    "tests/job/test_ray_workers.py": 521,
    "tests/project/test_docs_run.py": 447,
    "tests/job/test_start_up.py": 444,
    "tests/authoring/test_plugin_install.py": 442,
    "tests/commands/test_audit.py": 415,
    "tests/job/test_proof_key.py": 353,
    "tests/catalog/test_contract.py": 340,
    "tests/project/test_gpu_jobs_rehearsal.py": 267,
    "tests/authoring/test_from_pr_shapes.py": 267,
    "tests/authoring/test_from_pr_docs.py": 260,
    "tests/catalog/test_plugin_entries.py": 199,
    "tests/catalog/test_catalog.py": 187,
    "tests/entries/test_megatron_lm_6964.py": 147,
    "tests/upstream_tests/test_upstream_tests.py": 126,
    "tests/api/test_api.py": 92,
    "tests/entries/test_fused_sparse_mla_absorbed.py": 78,
    "tests/entries/test_megatron_lm_6114.py": 71,
    "tests/entries/test_megatron_lm_7466.py": 54,
    "tests/entries/test_megatron_lm_6793.py": 47,
    "tests/commands/test_cli_process.py": 47,
    "tests/sync/test_sync_upstream_fake_kernel.py": 39,
    "tests/commands/test_audit_cannot_probe.py": 30,
    "tests/job/test_hook_uninstall.py": 18,
    "tests/kinds/test_entry_parts.py": 18,
    "tests/entries/test_megatron_lm_6507.py": 15,
    "tests/job/test_startup_hook.py": 14,
    "tests/entries/test_megatron_lm_6890.py": 14,
    "tests/sync/test_sync_child.py": 13,
    "tests/authoring/test_from_pr_real_mirror.py": 13,
    "tests/entries/test_megatron_lm_5976.py": 11,
    "tests/upstream_tests/test_upstream_bundle.py": 11,
    "tests/interpreter/test_isolation.py": 10,
}


def _longest_files_first(item: pytest.Item) -> int:
    return -_FILE_SECONDS.get(item.nodeid.partition("::")[0], 0)


def pytest_report_header(config) -> str | None:  # type: ignore[no-untyped-def]
    seed = os.environ.get("BACKPORTS_TEST_ORDER_SEED", "").strip()
    return f"test order shuffled with seed {seed}" if seed else None
