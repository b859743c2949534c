"""Mutation testing of the package: can the tests tell a broken module from the real one?

    python benchmarks/mutation.py [--out benchmarks/results/mutation.json]
        [--max-per-module 15] [--only targeted|systematic|all] [--timeout 240]
        [--tests-map MAP.json] [--common-with OTHER_TREE] [--compare OTHER.json]
        [--ids ID,ID,...]

Not run in CI: it rewrites package files in this work tree, one mutant at a time, and
needs a clean ``backports/`` and ``vendor/`` (it refuses otherwise, and puts every file
back, byte for byte, even on Ctrl-C or a SIGTERM).

Two sets of mutants:

- **targeted**: the survivors named in issue 12, item 15 (the git cross-check, the sniff's
  output-shape check, late aliases on uninstall, the package_info version fallback, a
  vendored function that always returns None, ``verify_ranks`` ignoring ``group``, a
  start-up trigger that imports something), each run against the test files of its module.
- **systematic**: a small AST mutator over the modules that hold the logic of the
  decision, the kinds, the job and the evidence (``MODULE_TESTS``, or ``--tests-map``):
  comparison flips, ``and``/``or`` swaps, ``not`` dropped, ``if`` conditions negated,
  ``True``/``False`` swapped, integers + 1, ``return x`` -> ``return None``, call
  statements removed. Log lines, f-strings and docstrings are left alone (a mutant there
  changes nothing a test should see). At most ``--max-per-module`` per module.

Which mutants: each candidate has a key, the sha256 of (module, the source lines it
edits, the column, the operator, the new text): line numbers are not in it, so the same
edit of the same code has the same key at another commit. A module's mutants are its
candidates in the order of their keys (deterministic: the same source gives the same
mutants). ``--common-with TREE`` puts first the candidates whose key is also a candidate in
TREE's copy of the module, so a run at two commits mutates the same code where it did not
change; ``--compare OTHER.json`` then adds the kill rates over the mutants both runs share.

``--tests-map`` names, per module, the test files a developer would run after editing it
(JSON: {"decision/judging.py": ["tests/decision/test_judging.py", ...]}): an older commit
keeps its tests at other paths. Each mutant runs only its module's test files, ``-x -p
no:cacheprovider -m "not slow and not gpu"``, with a timeout; a mutant is *killed* when
pytest fails (or times out), else it *survived*. mutmut was not used: it runs tests against
a copied tree, while the tests here start subprocesses that import the package from this
work tree (editable install).
"""

import argparse
import ast
import contextlib
import hashlib
import json
import os
import platform
import re
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "backports" / "megatron"
VENDOR = ROOT / "vendor" / "megatron_lm_7617"
PYTEST_ARGS = ["-x", "-q", "-p", "no:cacheprovider", "-m", "not slow and not gpu"]

# Which tests guard which module (the files a developer would run after editing it), at this
# commit's test layout; paths are relative to backports/megatron/ and to the repository.
MODULE_TESTS: dict[str, list[str]] = {
    "decision/__init__.py": ["tests/decision/test_decision.py", "tests/decision/test_judging.py"],
    "decision/early.py": [
        "tests/decision/test_decision.py",
        "tests/decision/test_upstream_rule.py",
    ],
    "decision/judging.py": [
        "tests/decision/test_judging.py",
        "tests/decision/test_upstream_rule.py",
    ],
    "decision/sniffing.py": [
        "tests/decision/test_sniff_inside_import.py",
        "tests/decision/test_judging.py",
    ],
    "decision/verdict_cache.py": [
        "tests/decision/test_verdict_cache.py",
        "tests/decision/test_proof_store.py",
    ],
    "evidence/fingerprints.py": [
        "tests/decision/test_verdict_cache.py",
        "tests/decision/test_verdict_cache_guard.py",
    ],
    "evidence/git_ancestry.py": ["tests/evidence/test_git_ancestry.py"],
    "evidence/one_look.py": ["tests/evidence/test_distributions.py"],
    "evidence/versions.py": [
        "tests/evidence/test_versions.py",
        "tests/evidence/test_distributions.py",
    ],
    "job/deferred.py": ["tests/decision/test_sniff_inside_import.py", "tests/api/test_api.py"],
    "job/hook_file.py": ["tests/job/test_startup_hook.py", "tests/job/test_hook_uninstall.py"],
    "job/ranks.py": ["tests/job/test_ranks.py"],
    # test_start_up.py is all slow: the fast tests that reach the start-up path are the switches'.
    "job/start_up.py": ["tests/job/test_start_up.py", "tests/api/test_switches.py"],
    "job/startup_hook.py": ["tests/job/test_startup_hook.py"],
    "kinds/_bindings.py": ["tests/kinds/test_install.py"],
    "kinds/function.py": ["tests/kinds/test_function_forwarder.py", "tests/kinds/test_kinds.py"],
    "kinds/import_guard.py": ["tests/kinds/test_kinds.py"],
    "kinds/install.py": ["tests/kinds/test_install.py"],
    "kinds/module_attribute.py": ["tests/kinds/test_kinds.py"],
}
# A targeted mutant runs the test files of ``guard``, a key of the tests map: a module, or
# "targeted:<id>" for a mutant no module's tests are about (given in the map as well).
MODULE_TESTS["targeted:vendored-always-returns-none"] = [
    "tests/entries/test_fused_sparse_mla_absorbed_properties.py::"
    "test_never_raises_never_writes_and_is_none_or_right"
]


@dataclass(frozen=True)
class Targeted:
    """One named mutant: ``old`` (found exactly once in ``file``) becomes ``new``."""

    id: str
    file: str  # relative to the repository root
    old: str
    new: str
    guard: str  # the key of the tests map whose test files run
    what: str
    rehash: bool = False  # a vendored file: update UPSTREAM.toml as a sync --rehash would


TARGETED = [
    Targeted(
        "judging-git-cross-check-dropped",
        "backports/megatron/decision/judging.py",
        "    if any(contains.values()) != fixed and any(v is not None for v in contains.values()):",
        "    if False:",
        "decision/judging.py",
        "the verdict never says that the git checkout disagrees with the behaviour",
    ),
    Targeted(
        "judging-git-cross-check-inverted",
        "backports/megatron/decision/judging.py",
        "    if any(contains.values()) != fixed and",
        "    if any(contains.values()) == fixed and",
        "decision/judging.py",
        "the git disagreement note appears when git and behaviour agree",
    ),
    Targeted(
        "sniff-output-shape-unchecked",
        "backports/megatron/catalog/megatron_lm_7617.py",
        '        and probe["returned"] == [2, 1, 16, 512]\n',
        "",
        "decision/judging.py",
        "a function that pads for the kernel but returns the wrong shape counts as fixed",
    ),
    Targeted(
        "uninstall-late-aliases-ignored",
        "backports/megatron/kinds/_bindings.py",
        "    late = bindings_of_each([new])[id(new)]\n",
        "    late = []\n",
        "kinds/_bindings.py",
        "revert leaves our function in modules that imported it after the install",
    ),
    Targeted(
        "versions-package-info-fallback-dropped",
        "backports/megatron/evidence/versions.py",
        "        version = _version_from_package_info(package_dir)\n",
        "        version = None\n",
        "evidence/versions.py",
        "a checkout first on sys.path is reported with the installed distribution's version",
    ),
    Targeted(
        "versions-package-info-shadowing-ignored",
        "backports/megatron/evidence/versions.py",
        "own_dir in (None, package_dir)",
        "True",
        "evidence/versions.py",
        "metadata wins even when the imported code is another tree",
    ),
    Targeted(
        "vendored-always-returns-none",
        "vendor/megatron_lm_7617/tilelang_dsa.py",
        "    if _live_target().SparseMLA is None:\n",
        "    return None\n    if _live_target().SparseMLA is None:\n",
        "targeted:vendored-always-returns-none",
        "the installed function declines every call (UPSTREAM.toml rehashed, so it installs)",
        rehash=True,
    ),
    Targeted(
        "verify-ranks-ignores-group",
        "backports/megatron/job/ranks.py",
        "    import torch.distributed as dist\n\n    if not",
        "    import torch.distributed as dist\n\n    group = None\n    if not",
        "job/ranks.py",
        "verify_ranks compares over the default group whatever group it is given",
    ),
    Targeted(
        "startup-trigger-imports-a-module",
        "backports/megatron/__init__.py",
        "import os\nimport sys\n",
        'import os\nimport sys\n\n__import__("json")\n',
        "job/startup_hook.py",
        "every interpreter of the environment pays an import at start-up",
    ),
    Targeted(
        "startup-trigger-ignores-the-switch",
        "backports/megatron/__init__.py",
        'os.environ.get("MEGATRON_BACKPORTS", "")',
        'os.environ.get("MEGATRON_BACKPORTS" + "_", "")',
        "job/startup_hook.py",
        "the start-up trigger never reads MEGATRON_BACKPORTS (the name still appears)",
    ),
]


# ---- the systematic mutator ------------------------------------------------------------

_FLIP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}


@dataclass(frozen=True)
class Edit:
    """Replace source lines ``[line, end_line]`` columns ``[col, end_col)`` with ``text``."""

    line: int
    col: int
    end_line: int
    end_col: int
    text: str
    operator: str


def _is_log_or_warning(node: ast.Expr | ast.Call) -> bool:
    call = node.value if isinstance(node, ast.Expr) else node
    if not isinstance(call, ast.Call):
        return False
    func = call.func
    if isinstance(func, ast.Attribute):
        owner = func.value
        if isinstance(owner, ast.Name) and owner.id in {"_LOG", "logging", "warnings", "_log"}:
            return True
    return False


def _quiet_nodes(tree: ast.AST) -> set[int]:
    """Ids of nodes a mutation should not touch: log calls, f-strings, docstrings,
    annotations, ``__all__``."""
    quiet: set[int] = set()

    def mark(node: ast.AST) -> None:
        for sub in ast.walk(node):
            quiet.add(id(sub))

    for node in ast.walk(tree):
        log_call = isinstance(node, ast.Expr | ast.Call) and _is_log_or_warning(node)
        if log_call or isinstance(node, ast.JoinedStr):
            mark(node)
        elif isinstance(node, ast.Raise):
            mark(node)  # the message of an error; its condition is mutated at the `if`
        elif isinstance(node, ast.AnnAssign | ast.arg) and node.annotation is not None:
            mark(node.annotation)
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            for decorator in node.decorator_list:
                mark(decorator)  # @dataclass(frozen=True): no test should see frozen=False
            if isinstance(node, ast.FunctionDef) and node.returns is not None:
                mark(node.returns)
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            mark(node)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                mark(first)
    return quiet


def _edit(node: ast.AST, text: str, operator: str) -> Edit:
    return Edit(
        node.lineno,  # type: ignore[attr-defined]
        node.col_offset,  # type: ignore[attr-defined]
        node.end_lineno,  # type: ignore[attr-defined]
        node.end_col_offset,  # type: ignore[attr-defined]
        text,
        operator,
    )


def _mutations(tree: ast.AST) -> Iterator[Edit]:
    quiet = _quiet_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in quiet:
            continue
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _FLIP:
            flipped = ast.Compare(node.left, [_FLIP[type(node.ops[0])]()], node.comparators)
            yield _edit(node, f"({ast.unparse(flipped)})", "compare-flip")
        elif isinstance(node, ast.BoolOp):
            other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            yield _edit(node, f"({ast.unparse(ast.BoolOp(other, node.values))})", "and-or")
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            yield _edit(node, f"({ast.unparse(node.operand)})", "not-dropped")
        elif isinstance(node, ast.If | ast.While) and not isinstance(
            node.test, ast.Compare | ast.BoolOp | ast.UnaryOp
        ):
            yield _edit(node.test, f"(not {ast.unparse(node.test)})", "condition-negated")
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            yield _edit(node, repr(not node.value), "bool-swap")
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            yield _edit(node, repr(node.value + 1), "int-plus-one")
        elif isinstance(node, ast.Return) and node.value is not None:
            if not (isinstance(node.value, ast.Constant) and node.value.value is None):
                yield _edit(node, "return None", "return-none")
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            yield _edit(node, "pass", "call-removed")


def _apply_edit(source: str, edit: Edit) -> str:
    lines = source.splitlines(keepends=True)
    start = sum(len(line.encode()) for line in lines[: edit.line - 1])
    end = sum(len(line.encode()) for line in lines[: edit.end_line - 1])
    data = source.encode()
    before = data[: start + edit.col].decode()
    after = data[end + edit.end_col :].decode()
    return before + edit.text + after


def _snippet(source: str, edit: Edit) -> str:
    lines = source.splitlines()
    text = lines[edit.line - 1].strip()
    return text if edit.line == edit.end_line else text + " ..."


@dataclass
class Mutant:
    id: str
    file: str
    kind: str  # "targeted" or "systematic"
    operator: str
    line: int | None
    original: str
    mutated: str
    tests: list[str]
    key: str = ""  # the same edit of the same code has the same key at another commit
    what: str = ""
    status: str = "not run"  # killed, survived, timeout, no tests
    killed_by: str | None = None
    seconds: float = 0.0
    # Private: the whole mutated file text and whether UPSTREAM.toml is rehashed.
    _text: str = field(default="", repr=False)
    _rehash: bool = field(default=False, repr=False)


def _key(module: str, source: str, edit: Edit) -> str:
    """Line numbers left out: an edit of code that did not change keeps its key."""
    spanned = "\n".join(line.strip() for line in source.splitlines()[edit.line - 1 : edit.end_line])
    text = "\0".join([module, spanned, str(edit.col), edit.operator, edit.text])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _candidates(module: str, source: str, path: Path) -> list[tuple[str, Edit, str]]:
    """(key, edit, mutated text) of every mutant of ``source`` that compiles and changes it."""
    found: list[tuple[str, Edit, str]] = []
    seen: dict[str, int] = {}
    edits = sorted(_mutations(ast.parse(source)), key=lambda e: (e.line, e.col, e.operator))
    for edit in edits:
        text = _apply_edit(source, edit)
        try:
            compile(text, str(path), "exec")
        except SyntaxError:
            continue
        if text == source:
            continue
        key = _key(module, source, edit)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:  # the same line twice in a file: number the later ones
            key = f"{key}-{seen[key]}"
        found.append((key, edit, text))
    return found


def _keys_in(tree: Path, module: str) -> set[str]:
    path = tree / "backports" / "megatron" / module
    if not path.is_file():
        return set()
    return {key for key, _, _ in _candidates(module, path.read_text(encoding="utf-8"), path)}


def systematic_mutants(
    tests_map: dict[str, list[str]], max_per_module: int, common_with: Path | None
) -> list[Mutant]:
    mutants: list[Mutant] = []
    for module, tests in tests_map.items():
        if module.startswith("targeted:"):
            continue
        path = PACKAGE / module
        source = path.read_text(encoding="utf-8")
        candidates = _candidates(module, source, path)
        shared = _keys_in(common_with, module) if common_with is not None else set()
        # Shared code first, then by key: a spread over the file that stays put when
        # other lines move.
        candidates.sort(key=lambda c: (c[0] not in shared, c[0]))
        chosen = sorted(candidates[:max_per_module], key=lambda c: (c[1].line, c[1].col))
        for key, edit, text in chosen:
            mutants.append(
                Mutant(
                    id=f"{module}:{edit.line}:{edit.col}:{edit.operator}",
                    file=path.relative_to(ROOT).as_posix(),
                    kind="systematic",
                    operator=edit.operator,
                    line=edit.line,
                    original=_snippet(source, edit),
                    mutated=_snippet(text, edit),
                    tests=tests,
                    key=key,
                    _text=text,
                )
            )
    # Round robin over the modules (each module's first mutant, then each one's second, ...):
    # a run stopped by --budget-s has still spread its mutants over every module.
    rank: dict[str, int] = {}
    order: list[tuple[int, int, Mutant]] = []
    for index, mutant in enumerate(mutants):
        rank[mutant.file] = rank.get(mutant.file, -1) + 1
        order.append((rank[mutant.file], index, mutant))
    return [mutant for _, _, mutant in sorted(order, key=lambda o: (o[0], o[1]))]


def targeted_mutants(tests_map: dict[str, list[str]]) -> list[Mutant]:
    mutants = []
    for t in TARGETED:
        source = (ROOT / t.file).read_text(encoding="utf-8")
        count = source.count(t.old)
        if count != 1:
            raise SystemExit(f"targeted mutant {t.id}: {t.old!r} occurs {count} times in {t.file}")
        if t.guard not in tests_map:
            raise SystemExit(f"targeted mutant {t.id}: the tests map has no {t.guard!r}")
        line = source[: source.index(t.old)].count("\n") + 1
        mutants.append(
            Mutant(
                id=t.id,
                file=t.file,
                kind="targeted",
                operator="targeted",
                line=line,
                original=t.old.strip(),
                mutated=t.new.strip() or "(line removed)",
                tests=tests_map[t.guard],
                key=t.id,
                what=t.what,
                _text=source.replace(t.old, t.new),
                _rehash=t.rehash,
            )
        )
    return mutants


# ---- running ---------------------------------------------------------------------------


def _drop_bytecode(path: Path) -> None:
    for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        pyc.unlink(missing_ok=True)


def _rehashed_manifest(manifest: str, vendored_file: Path) -> str:
    """UPSTREAM.toml with the sha256s a ``sync_upstream.py --rehash`` would write."""
    sys.path.insert(0, str(ROOT))
    from backports.megatron.vendored import python_files_digest

    digest = hashlib.sha256(vendored_file.read_bytes()).hexdigest()
    manifest = re.sub(r'(?m)^sha256 = "[0-9a-f]*"$', f'sha256 = "{digest}"', manifest)
    files = python_files_digest(vendored_file.parent)
    return re.sub(r'(?m)^files_sha256 = "[0-9a-f]*"$', f'files_sha256 = "{files}"', manifest)


def _pytest(tests: list[str], timeout: float) -> tuple[str, str | None, float]:
    """(status, first failing test, seconds) on the code as it is now."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", *PYTEST_ARGS, *tests]
    start = time.perf_counter()
    # A session of its own: on a timeout or Ctrl-C the interpreters the tests started go
    # too (killing pytest alone leaves them running, orphaned).
    with subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            stdout, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            return "timeout", None, time.perf_counter() - start
        except BaseException:
            _kill_group(process)
            raise
    seconds = time.perf_counter() - start
    if process.returncode == 0:
        return "survived", None, seconds
    if process.returncode == 5:  # no test selected (all slow): nothing guards the module
        return "no tests", None, seconds
    failed = re.search(r"^(?:FAILED|ERROR) (\S+)", stdout, re.MULTILINE)
    return "killed", failed.group(1) if failed else f"pytest exit {process.returncode}", seconds


def _kill_group(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.communicate()


def run_mutant(mutant: Mutant, timeout: float) -> None:
    path = ROOT / mutant.file
    manifest = VENDOR / "UPSTREAM.toml"
    saved = {path: path.read_bytes()}
    if mutant._rehash:
        saved[manifest] = manifest.read_bytes()
    try:
        path.write_text(mutant._text, encoding="utf-8")
        _drop_bytecode(path)
        if mutant._rehash:
            manifest.write_text(
                _rehashed_manifest(manifest.read_text(encoding="utf-8"), path), encoding="utf-8"
            )
        mutant.status, mutant.killed_by, mutant.seconds = _pytest(mutant.tests, timeout)
    finally:
        for file, data in saved.items():
            file.write_bytes(data)
            _drop_bytecode(file)


def _clean_tree() -> None:
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "backports", "vendor"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if dirty.strip():
        raise SystemExit(f"backports/ or vendor/ has uncommitted changes:\n{dirty}")


def _baseline(mutants: list[Mutant], timeout: float) -> None:
    """The tests must pass on the real code, or a kill means nothing (one run of every
    file the mutants use: one import of megatron instead of one per selection)."""
    files = sorted({test for m in mutants for test in m.tests})
    status, failed, _ = _pytest(files, timeout * 4)
    if status != "survived":
        raise SystemExit(f"tests fail on the unmutated code ({status}: {failed}): {files}")


def _counts(mutants: list[Mutant]) -> dict[str, Any]:
    mutants = [m for m in mutants if m.status != "not run"]
    killed = sum(m.status in ("killed", "timeout") for m in mutants)
    return {
        "mutants": len(mutants),
        "killed": killed,
        "survived": sum(m.status in ("survived", "no tests") for m in mutants),
        "kill_rate": round(killed / len(mutants), 3) if mutants else None,
    }


def _summary(mutants: list[Mutant]) -> dict[str, dict[str, Any]]:
    summary: dict[str, dict[str, Any]] = {}
    for kind in ("targeted", "systematic", "all"):
        chosen = [m for m in mutants if kind in ("all", m.kind)]
        if chosen:
            summary[kind] = _counts(chosen)
    return summary


def _per_module(mutants: list[Mutant]) -> dict[str, dict[str, Any]]:
    files = dict.fromkeys(m.file for m in mutants if m.kind == "systematic")
    return {
        f: _counts([m for m in mutants if m.file == f and m.kind == "systematic"]) for f in files
    }


def _comparison(mutants: list[Mutant], other_path: Path) -> dict[str, Any]:
    """Kill rates of this run and ``other_path``'s over the mutants both ran (same key)."""
    other = json.loads(other_path.read_text(encoding="utf-8"))
    theirs = {m["key"]: m for m in other["mutants"] if m["status"] != "not run"}
    shared = [m for m in mutants if m.key in theirs and m.status != "not run"]

    def killed(status: str) -> bool:
        return status in ("killed", "timeout")

    differ = [
        {"key": m.key, "id": m.id, "this": m.status, "other": theirs[m.key]["status"]}
        for m in shared
        if killed(m.status) != killed(theirs[m.key]["status"])
    ]
    other_killed = sum(killed(theirs[m.key]["status"]) for m in shared)
    return {
        "other": other_path.name,
        "other_git_head": other["git_head"],
        "shared_mutants": len(shared),
        "this_killed": sum(killed(m.status) for m in shared),
        "other_killed": other_killed,
        "this_kill_rate": _counts(shared)["kill_rate"],
        "other_kill_rate": round(other_killed / len(shared), 3) if shared else None,
        "outcome_differs": differ,
    }


def _write_markdown(path: Path, result: dict[str, Any]) -> None:
    lines = [
        "# Mutation testing",
        "",
        f"Command: `{result['command']}`  ",
        f"Pytest per mutant: `pytest {' '.join(PYTEST_ARGS)} <test files>`  ",
        f"Git: `{result['git_head']}`  ",
        f"Mutants run in {result['seconds']} s wall, {result['cpu_seconds']} s CPU "
        "(user+sys of the pytest children, the baseline run included)"
        + ("" if result["complete"] else "; stopped early (--budget-s): the rest not run"),
        "",
    ]
    for update in result.get("updates", []):
        lines.insert(
            -1,
            f"Re-run: `{update['command']}` at `{update['git_head']}` "
            f"({update['seconds']} s wall, {update['cpu_seconds']} s CPU)  ",
        )
    lines += [
        "| set | mutants | killed | survived | kill rate |",
        "| --- | --- | --- | --- | --- |",
    ]
    for kind, counts in result["summary"].items():
        lines.append(
            f"| {kind} | {counts['mutants']} | {counts['killed']} | {counts['survived']} "
            f"| {counts['kill_rate']} |"
        )
    if "compared" in result:
        c = result["compared"]
        lines += [
            "",
            f"## Over the mutants this run shares with {c['other']} (`{c['other_git_head']}`)",
            "",
            f"{c['shared_mutants']} mutants with the same key (the same edit of the same "
            f"code): killed here {c['this_killed']} ({c['this_kill_rate']}), there "
            f"{c['other_killed']} ({c['other_kill_rate']}).",
        ]
        for d in c["outcome_differs"]:
            lines.append(f"- `{d['id']}`: {d['this']} here, {d['other']} there")
    lines += ["", "## Per module (systematic)", "", "| module | tests | mutants | killed |"]
    lines.append("| --- | --- | --- | --- |")
    for file, counts in result["per_module"].items():
        module = file.removeprefix("backports/megatron/")
        tests = ", ".join(t.removeprefix("tests/") for t in result["module_tests"][module])
        lines.append(f"| `{module}` | {tests} | {counts['mutants']} | {counts['killed']} |")
    if any(m["kind"] == "targeted" for m in result["mutants"]):
        lines += ["", "## Targeted", "", "| mutant | status | killed by | what it breaks |"]
        lines.append("| --- | --- | --- | --- |")
        for m in result["mutants"]:
            if m["kind"] == "targeted":
                lines.append(f"| `{m['id']}` | {m['status']} | `{m['killed_by']}` | {m['what']} |")
    lines += ["", "## Systematic survivors", "", "| mutant | key | original | mutated |"]
    lines.append("| --- | --- | --- | --- |")
    for m in result["mutants"]:
        if m["kind"] == "systematic" and m["status"] in ("survived", "no tests"):
            original = m["original"].replace("|", "\\|")
            mutated = m["mutated"].replace("|", "\\|")
            lines.append(f"| `{m['id']}` | `{m['key']}` | `{original}` | `{mutated}` |")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _tests_map(path: Path | None) -> dict[str, list[str]]:
    if path is None:
        return MODULE_TESTS
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise SystemExit(f"--tests-map {path}: {error}") from None
    if not isinstance(loaded, dict) or not all(
        isinstance(v, list) and all(isinstance(t, str) for t in v) for v in loaded.values()
    ):
        raise SystemExit(f"--tests-map {path}: not a JSON object of module -> [test files]")
    missing = [t.split("::")[0] for v in loaded.values() for t in v]
    missing = [t for t in missing if not (ROOT / t).is_file()]
    if missing:
        raise SystemExit(f"--tests-map {path}: no such test files here: {missing}")
    return loaded


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _same_as(mutants: list[Mutant], other_path: Path) -> list[Mutant]:
    """The mutants (by key) that the run written to ``other_path`` ran, in its order."""
    other = json.loads(other_path.read_text(encoding="utf-8"))
    ran = [m["key"] for m in other["mutants"] if m["status"] != "not run"]
    by_key = {m.key: m for m in mutants}
    missing = [key for key in ran if key not in by_key]
    if missing:
        print(f"--same-as: {len(missing)} of its mutants are not candidates here", flush=True)
    return [by_key[key] for key in ran if key in by_key]


def _merged(earlier: list[dict[str, Any]], mutants: list[Mutant]) -> list[Mutant]:
    """The earlier run's mutants, those run now replaced (by key): a re-run of a few."""
    names = {f.name for f in fields(Mutant) if not f.name.startswith("_")}
    now = {m.key: m for m in mutants if m.status != "not run"}
    kept = [Mutant(**{k: v for k, v in m.items() if k in names}) for m in earlier]
    merged = [now.pop(m.key, m) for m in kept]
    return merged + list(now.values())


def _write(
    args: argparse.Namespace,
    tests_map: dict[str, list[str]],
    mutants: list[Mutant],
    wall: float,
    cpu: float,
    complete: bool,
    earlier: dict[str, Any] | None,
) -> dict[str, Any]:
    head = subprocess.run(
        ["git", "log", "-1", "--format=%h %s"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    command = "python benchmarks/mutation.py " + " ".join(sys.argv[1:])
    run = {"command": command, "git_head": head, "seconds": round(wall, 1)}
    if earlier is not None:  # --update: the first run's figures stay, this one is added
        mutants = _merged(earlier["mutants"], mutants)
        updates = [*earlier.get("updates", []), {**run, "cpu_seconds": round(cpu, 1)}]
        command, wall, cpu = earlier["command"], earlier["seconds"], earlier["cpu_seconds"]
        head = earlier["git_head"]
        complete = all(m.status != "not run" for m in mutants)
    result: dict[str, Any] = {
        "command": command,
        "pytest_args": PYTEST_ARGS,
        "module_tests": tests_map,
        "git_head": head,
        "python": platform.python_version(),
        "complete": complete,
        "seconds": round(wall, 1),
        "cpu_seconds": round(cpu, 1),
        "summary": _summary(mutants),
        "per_module": _per_module(mutants),
    }
    if earlier is not None:
        result["updates"] = updates
    if args.compare is not None:
        result["compared"] = _comparison(mutants, args.compare)
    result["mutants"] = [
        {k: v for k, v in asdict(m).items() if not k.startswith("_")} for m in mutants
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    _write_markdown(args.out.with_suffix(".md"), result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/mutation.json")
    parser.add_argument("--max-per-module", type=int, default=15)
    parser.add_argument("--only", choices=["targeted", "systematic", "all"], default="all")
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--tests-map", type=Path, help="JSON: module -> its test files")
    parser.add_argument("--common-with", type=Path, help="another work tree: shared code first")
    parser.add_argument("--compare", type=Path, help="another run's JSON: kill rates over both")
    parser.add_argument("--same-as", type=Path, help="another run's JSON: run only its mutants")
    parser.add_argument("--ids", help="comma-separated mutant ids: run only these")
    parser.add_argument(
        "--update",
        action="store_true",
        help="keep --out's results for the mutants not run this time (a re-run of a few)",
    )
    parser.add_argument(
        "--budget-s", type=float, help="start no mutant after this many seconds (rest: not run)"
    )
    args = parser.parse_args()
    tests_map = _tests_map(args.tests_map)
    earlier = json.loads(args.out.read_text(encoding="utf-8")) if args.update else None

    _clean_tree()
    # SIGTERM and SIGINT (ignored by a shell's background job) behave as Ctrl-C: the
    # `finally` in run_mutant puts the file back.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    mutants = []
    if args.only in ("targeted", "all"):
        mutants += targeted_mutants(tests_map)
    if args.only in ("systematic", "all"):
        mutants += systematic_mutants(tests_map, args.max_per_module, args.common_with)
    if args.same_as is not None:
        mutants = _same_as(mutants, args.same_as)
    if args.ids:
        wanted = set(args.ids.split(","))
        mutants = [m for m in mutants if m.id in wanted]
        if wanted - {m.id for m in mutants}:
            raise SystemExit(f"--ids: no such mutants: {sorted(wanted - {m.id for m in mutants})}")
    start = time.perf_counter()
    _baseline(mutants, args.timeout)
    complete = False
    try:
        for number, mutant in enumerate(mutants, 1):
            if args.budget_s is not None and time.perf_counter() - start > args.budget_s:
                print(f"--budget-s {args.budget_s:g} spent: {len(mutants) - number + 1} not run")
                break
            run_mutant(mutant, args.timeout)
            print(
                f"[{number}/{len(mutants)}] {mutant.status:8} {mutant.id} ({mutant.seconds:.1f}s)"
                f"{' by ' + mutant.killed_by if mutant.killed_by else ''}",
                flush=True,
            )
            # Written after each mutant: a run stopped early keeps what it measured.
            _write(
                args,
                tests_map,
                mutants,
                time.perf_counter() - start,
                _children_cpu(),
                False,
                earlier,
            )
        else:
            complete = True
    except KeyboardInterrupt:
        print("interrupted: the results so far are written", flush=True)
    _clean_tree()
    wall = time.perf_counter() - start
    result = _write(args, tests_map, mutants, wall, _children_cpu(), complete, earlier)
    print(json.dumps(result["summary"]))
    if "compared" in result:
        print(json.dumps({k: v for k, v in result["compared"].items() if k != "outcome_differs"}))


if __name__ == "__main__":
    main()
