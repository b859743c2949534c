"""``backports new --from-pr N --repo CLONE``: exit 0 written and proven, 1 refused or not
proven (nothing written, or with --keep-unfinished a plugin ``check`` fails), 2 bad input.

The fast tests stop before any code of the pull request runs; the slow ones derive, prove
and write whole plugins from the fixture repository (each in a few minutes)."""

import ast
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import pytest

from backports.megatron import cli
from backports.megatron.authoring.from_pr.command import CHILDREN_NOTICE
from tests.from_pr_fixture import GELU, NEWEST, Upstream, shared
from tests.paths import ROOT


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return shared(tmp_path_factory)


@pytest.fixture(autouse=True)
def _scratch_in_the_tests_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The derivation's scratch folders and its children's temporary files stay here."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _new(upstream: Upstream, number: int, dest: Path, *extra: str) -> int:
    argv = ["new", "--from-pr", str(number), "--repo", str(upstream.path), "--dest", str(dest)]
    return cli.main([*argv, *extra])


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--from-pr", "101"], "--from-pr needs --repo"),
        (["--from-pr", "101", "--repo", "REPO", "--id", "Not_An_Id"], "--id must be"),
        (["--from-pr", "101", "--repo", "REPO", "--id", "megatron-lm-101"], "own entries"),
        (["--from-pr", "101", "--repo", "REPO", "--dest", "EXISTS"], "exists"),
        (["--from-pr", "101", "--repo", "NOWHERE"], "not a git repository"),
    ],
)
def test_bad_input_is_exit_2_in_one_line(upstream, tmp_path, capsys, argv, says) -> None:
    (tmp_path / "exists").mkdir()
    values = {"REPO": str(upstream.path), "EXISTS": str(tmp_path / "exists")}
    values["NOWHERE"] = str(tmp_path / "nowhere")
    argv = [values.get(a, a) for a in argv]
    assert cli.main(["new", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err


def test_plain_new_still_needs_its_flags(capsys) -> None:
    assert cli.main(["new", "--id", "acme-1"]) == 2
    assert "new needs --pr, --repo, --target, --dest" in capsys.readouterr().err


def test_a_pull_request_newer_than_the_clone_is_one_line_and_nothing_written(
    upstream, tmp_path, capsys
) -> None:
    dest = tmp_path / "plugin"
    assert _new(upstream, NEWEST + 1, dest) == 1
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"backports new: [not-in-clone] #{NEWEST + 1} is newer than this clone (its newest "
        f"pull ref is #{NEWEST}): fetch it first (git fetch origin pull/{NEWEST + 1}/head:"
        f"refs/pull/{NEWEST + 1}/head); "
        "nothing written"
    ]
    assert out == f"{CHILDREN_NOTICE}\n" and not dest.exists()


def test_a_fix_over_the_budget_is_refused_with_its_figures(upstream, tmp_path, capsys) -> None:
    dest = tmp_path / "plugin"
    assert _new(upstream, 104, dest, "--keep-unfinished") == 1
    out, err = capsys.readouterr()
    assert err.startswith("backports new: [over-budget] over the size budget: 10 carried symbols")
    assert "(limit 8)" in err and "nothing written" in err
    assert "pull request #104" in out  # what was derived up to the refusal
    assert out.splitlines()[0] == CHILDREN_NOTICE  # said first, whatever comes after
    assert not dest.exists()


def test_the_notice_says_the_pull_requests_code_runs_with_the_users_rights() -> None:
    for words in ("its tests included", "with your rights", "child processes", "pip install"):
        assert words in CHILDREN_NOTICE
    doc = (ROOT / "docs" / "from-pr.md").read_text()
    assert "It runs the pull request's code, its tests included, with your rights" in doc
    assert "as `pip install`\nof a package would" in doc


def test_a_non_python_file_of_the_fix_under_megatron_is_refused(upstream, tmp_path, capsys):
    """#115 changes ``divide`` and ``megatron/core/limits.json``: a function swap carries
    the first only, so the fix would be half carried: refused, nothing written."""
    dest = tmp_path / "plugin"
    assert _new(upstream, 115, dest) == 1
    out, err = capsys.readouterr()
    said = "other files it changes, not carried (docs, configs, test helpers): "
    assert f"{said}megatron/core/limits.json" in out
    assert err.splitlines() == [
        "backports new: [shape] #115 also changes megatron/core/limits.json, and --from-pr carries "
        "Python functions only: the backport would lack that part of the fix; write it by "
        "hand (backports new --pr 115 --repo ... --target ...); nothing written"
    ]
    assert not dest.exists()


def test_an_octopus_merge_of_another_change_is_refused(upstream, tmp_path, capsys) -> None:
    dest = tmp_path / "plugin"
    assert _new(upstream, 116, dest) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "also merges" in err and "nothing written" in err
    assert not dest.exists()


def test_a_conflict_shows_its_hunk_and_writes_nothing(upstream, tmp_path, capsys) -> None:
    dest = tmp_path / "plugin"
    assert _new(upstream, 103, dest) == 1
    err = capsys.readouterr().err
    first, *hunk = err.splitlines()
    assert "GeLUFunction.backward: 1 hunk(s) of the pull request do not apply" in first
    assert first.endswith("nothing written") and first.startswith("backports new: [conflict] ")
    assert "  <<<<<<< installed" in hunk and "  >>>>>>> pull request" in hunk
    assert not dest.exists()


# ---- whole derivations (slow) --------------------------------------------------------------


def _installed_check(
    plugin: Path, backport_id: str, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """``backports check --only ID`` with the plugin pip-installed into a folder of this
    test's (PYTHONPATH), in a child that takes nothing from this folder."""
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
    pip += ["--no-build-isolation", "--target", str(site), str(plugin)]
    subprocess.run(pip, check=True, capture_output=True, cwd=tmp_path)
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    env["MEGATRON_BACKPORTS_CACHE_DIR"] = str(tmp_path / "cache")
    return subprocess.run(
        [sys.executable, "-P", "-m", "backports.megatron", "check", "--only", backport_id],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
        check=False,
    )


@pytest.mark.slow
def test_a_function_fix_with_a_cpu_test_is_proven_by_its_own_test(
    upstream, tmp_path, capsys, monkeypatch
) -> None:
    """#101: route a. The plugin is written only after the contract kit and check passed
    in children; nothing of the pull request was imported here, and nothing was written
    outside --dest (the children's home and temporary files went with the scratch folder)."""
    dest = tmp_path / "plugin"
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    assert _new(upstream, 101, dest) == 0, capsys.readouterr().err
    assert list(home.iterdir()) == [] and list((tmp_path / "tmp").iterdir()) == []
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == CHILDREN_NOTICE  # said before anything of the pull request ran
    assert "  divide: route a, the pull request's own test, run on the target" in out
    assert "  backports check --only mlm-pr-101: exit 0" in "\n".join(lines)
    assert "a person must still write:" in out
    assert not [m for m in sys.modules if m.startswith("mlm_pr_101")]
    package = dest / "mlm_pr_101_backport"
    entry = (package / "entry.py").read_text()
    assert "ROUTE = 'a'" in entry
    carried_test = (package / "_upstream_test.py").read_text()
    assert "def test_divide_refuses_a_remainder_with_value_error" in carried_test
    manifest = tomllib.loads((package / "vendor" / "mlm_pr_101" / "UPSTREAM.toml").read_text())
    assert manifest["head_sha"] == upstream.sha("head101")
    assert manifest["merge_sha"] == upstream.sha("merge101")
    assert manifest["upstream_tests"] == [
        "tests/unit_tests/test_utils.py::test_divide_refuses_a_remainder_with_value_error"
    ]
    assert manifest["origin"] == "synced" and manifest["symbol"] == ["divide"]
    for name in ("pyproject.toml", "README.md", "tests/test_mlm_pr_101.py"):
        assert (dest / name).is_file()


@pytest.mark.slow
def test_a_drifted_autograd_backward_is_proven_by_the_tests_observation(
    upstream, tmp_path, capsys
) -> None:
    """#102: the release's backward differs from the pull request's base (#90); only
    #102's hunk is carried; the sniff is route b (the test observes ``clamp``): its test
    class has a ``setup_method``, which route a does not run around a test."""
    dest = tmp_path / "plugin"
    assert _new(upstream, 102, dest) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "GeLUFunction.backward: route b" in out
    assert "drifted since the base: only this pull request's hunks merged in" in out
    vendored = dest / "mlm_pr_102_backport" / "vendor" / "mlm_pr_102" / "fused_bias_gelu.py"
    text = vendored.read_text()
    assert "tmp = tmp.clamp(-1.0, 1.0)" in text and "ctx.saved_tensors[0]" not in text
    done = _installed_check(dest, "mlm-pr-102", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_a_sniff_that_judges_code_shape_is_replaced_by_one_every_rewrite_agrees_with(
    upstream, tmp_path, capsys
) -> None:
    """#117 spells the rule another way (``!=``/``and`` to ``not in``) as it adds an
    algorithm. Stand-ins answer ``algo != "atomic"`` and ``"atomic" == algo`` as two
    questions, so the first input that tells the versions apart is one where ``algo`` is
    "atomic" and not "atomic" at once: a sniff of spelling. The rewrites (the installed
    rule as ``not in``, the fixed one as a chain of ``!=``) discard it; the sniff kept is
    the fix's case, read alike in every spelling: ``algo`` is "fully_parallel_async"."""
    dest = tmp_path / "plugin"
    assert _new(upstream, 117, dest) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    entry = (dest / "mlm_pr_117_backport" / "entry.py").read_text()
    truths = re.search(r"'truths': (\{[^}]*\})", entry)
    assert truths is not None, entry
    said = {k for k, v in ast.literal_eval(truths.group(1)).items() if v}
    assert said == {
        "(algo != 'atomic')",
        "(algo != 'fully_parallel')",
        "(algo == 'fully_parallel_async')",
    }
    rewrites = next(line for line in out.splitlines() if "      rewrites (" in line)
    passed, discarded = re.search(r"(\d+) passed, (\d+) candidate sniff", rewrites).groups()
    assert int(passed) >= 4 and int(discarded) >= 1, rewrites
    assert "installed: comparisons" in rewrites or "comparisons," in rewrites
    assert f"sniff soundness: {passed} semantics-preserving rewrite(s)" in out


@pytest.mark.slow
def test_a_test_that_raises_inside_the_target_on_the_installed_code_is_route_a(
    upstream, tmp_path, capsys
) -> None:
    """#118's test calls ``scaled_init_method_normal(0.02, 0)``: the installed code raises
    ZeroDivisionError inside it (pytest says FAILED: the bug), the fixed one the plain init. The
    test is the sniff; at run time a raise inside the target reads as needed."""
    dest = tmp_path / "plugin"
    assert _new(upstream, 118, dest) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "  scaled_init_method_normal: route a, the pull request's own test" in out
    entry = (dest / "mlm_pr_118_backport" / "entry.py").read_text()
    assert "ROUTE = 'a'" in entry
    done = _installed_check(dest, "mlm-pr-118", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "needed" in done.stdout
    # Nothing of the author's machine is written: the fixture clone has no origin, so the
    # plugin names the upstream repository, not the clone's folder (or the venv's).
    manifest = tomllib.loads(
        (dest / "mlm_pr_118_backport" / "vendor" / "mlm_pr_118" / "UPSTREAM.toml").read_text()
    )
    assert manifest["repo"] == "NVIDIA/Megatron-LM"
    # The fix's text is recorded (what lets status say upstream once a release has it),
    # as the merge holds it; the installed text is not it.
    from backports.megatron.evidence.fix_text import symbol_digest
    from tests.from_pr_fixture import UTILS, installed_text

    merged = upstream.repo.git.show(f"{upstream.sha('merge118')}:{UTILS}")
    name = "scaled_init_method_normal"
    assert manifest["fixed_symbols_sha256"] == {name: symbol_digest(merged, name)}
    assert symbol_digest(installed_text(UTILS), name) != symbol_digest(merged, name)
    machine = (str(upstream.path), str(tmp_path), sys.prefix, str(Path.home()))
    for written in dest.rglob("*"):
        if written.is_file():
            text = written.read_text(encoding="utf-8", errors="replace")
            assert not [p for p in machine if p in text], (
                written,
                [p for p in machine if p in text],
            )


@pytest.mark.slow
def test_a_fix_seen_only_in_what_it_hands_a_process_group_is_route_c_with_callees_recorded(
    upstream, tmp_path, capsys
) -> None:
    """#128's ``_reduce`` all-reduces a float32 copy: on CPU ``torch.distributed.all_reduce``
    raises on stand-ins in both versions, so the plain search sees nothing. Its last try
    records ``torch.distributed``: the versions hand it different tensors and return
    different ones. The plugin replays that recording at run time."""
    dest = tmp_path / "plugin"
    assert _new(upstream, 128, dest) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "  _reduce: route c, a differential search" in out, out
    entry = (dest / "mlm_pr_128_backport" / "entry.py").read_text()
    assert "'torch.distributed'" in entry, entry
    assert "call torch.distributed.all_reduce#0" in entry  # recorded, not run
    done = _installed_check(dest, "mlm-pr-128", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "needed" in done.stdout


@pytest.mark.slow
def test_a_parametrized_test_of_a_plain_class_through_a_helper_is_route_a(
    upstream, tmp_path, capsys
) -> None:
    """#129's test is a parametrized method of a plain test class; it reaches the static
    method only through a module alias inside a module-level helper. Route a runs it with
    its helper, once per case, the target bound where the helper reads it; the plugin
    carries that runner and replays it at every probe."""
    dest = tmp_path / "plugin"
    assert _new(upstream, 129, dest) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    shown = "  VocabUtility.vocab_range_from_per_partition_vocab_size: route a, the pull"
    assert shown in out, out
    package = dest / "mlm_pr_129_backport"
    assert "ROUTE = 'a'" in (package / "entry.py").read_text()
    carried = (package / "_upstream_test.py").read_text()
    assert "def _vocab_range(rank, world_size):" in carried  # the helper came along
    assert "TestVocabRange().test_a_rank_outside_the_world_is_refused(**_case)" in carried
    assert "[{'rank': 2}, {'rank': -1}]" in carried


@pytest.mark.slow
def test_keep_unfinished_writes_a_plugin_that_check_fails(upstream, tmp_path, capsys) -> None:
    """#103's hunk does not apply: with --keep-unfinished the plugin is written (its sniff
    unfinished), exit 1, and ``backports check`` fails on it once installed."""
    dest = tmp_path / "plugin"
    assert _new(upstream, 103, dest, "--keep-unfinished") == 1
    err = capsys.readouterr().err
    assert "UNFINISHED" in err and str(dest) in err
    entry = (dest / "mlm_pr_103_backport" / "entry.py").read_text()
    assert "UNFINISHED = " in entry and "do not apply" in entry
    done = _installed_check(dest, "mlm-pr-103", tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "incompatible" in done.stdout
    # Failed for the reason it was written unfinished: its sniff says so.
    assert "its sniff raised NotImplementedError" in done.stdout
    assert "do not apply to the installed text" in done.stdout


def test_the_fixture_names_what_the_tests_expect() -> None:
    assert GELU.endswith("fused_bias_gelu.py")


def test_a_recursion_error_anywhere_is_one_line_and_nothing_written(
    upstream, tmp_path, capsys, monkeypatch
) -> None:
    """Past the parse that names the file, any step may meet a tree too deep (unparse,
    dump): one line, exit 1, nothing written, the scratch folder gone."""
    from backports.megatron.authoring.from_pr import command

    def too_deep(*args: object, **kwargs: object) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(command, "locate", too_deep)
    dest = tmp_path / "plugin"
    assert _new(upstream, 101, dest) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "backports new: the pull request's code is too deeply nested or too big to analyse "
        "(RecursionError); nothing written"
    ]
    assert not dest.exists() and list((tmp_path / "tmp").iterdir()) == []


# ---- stopped mid-run: nothing of it outlives it (issue 42) -----------------------------------


def _descendants(root: int) -> set[int]:
    """Every process under ``root`` now (children started in sessions of their own too)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize(
    ("phase", "sig"),
    [("the sniff", signal.SIGTERM), ("upstream-tests", signal.SIGTERM), ("upstream-tests", 2)],
)
def test_a_stop_mid_run_leaves_no_scratch_folder_and_no_child(
    upstream, tmp_path, phase, sig
) -> None:
    """``new --from-pr`` in a process of its own, stopped (SIGTERM, or Ctrl-C's SIGINT)
    once the sniff child runs, or once upstream-tests has made its folder: the process
    ends, no folder is left in the temporary folder, and no process it started lives on."""
    tmp = tmp_path / "tmp"  # the autouse fixture made it; TMPDIR for the command
    argv = [sys.executable, "-P", "-m", "backports.megatron", "new", "--from-pr", "101"]
    argv += ["--repo", str(upstream.path), "--dest", str(tmp_path / "plugin")]
    env = {**os.environ, "TMPDIR": str(tmp), "MEGATRON_BACKPORTS_CACHE_DIR": str(tmp_path / "c")}
    # Started as from a terminal: a shell's background job (a CI step, nohup) would hand on
    # SIGINT ignored, and Ctrl-C would then mean nothing to the command.
    process = subprocess.Popen(
        argv,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    seen: set[int] = set()
    deadline = time.monotonic() + 900
    while process.poll() is None and time.monotonic() < deadline:
        seen |= _descendants(process.pid)
        if phase == "the sniff" and seen:
            break
        if phase == "upstream-tests" and list(tmp.rglob("backports-upstream-*/upstream")):
            break
        time.sleep(0.2)
    assert process.poll() is None, f"ended before {phase}"
    seen |= _descendants(process.pid)
    process.send_signal(sig)
    code = process.wait(timeout=120)
    assert code == (-signal.SIGTERM if sig == signal.SIGTERM else 130)
    assert list(tmp.iterdir()) == []
    deadline = time.monotonic() + 30
    while [p for p in seen if _running(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [p for p in seen if _running(p)] == []
    assert not (tmp_path / "plugin").exists()


def test_a_stop_while_the_plugin_is_written_leaves_nothing_at_dest(tmp_path, monkeypatch) -> None:
    """The plugin is copied beside ``--dest`` under a hidden name and renamed: a Ctrl-C or
    SIGTERM mid-copy leaves neither a half plugin nor the copy."""
    from backports.megatron.authoring.from_pr import command

    def write_plugin(d: object, staging: Path) -> None:
        (staging / "pkg").mkdir(parents=True)
        for name in ("a.py", "b.py"):
            (staging / "pkg" / name).write_text("x = 1\n")

    def stopped_mid_copy(source: str, target: str, *args: object, **kwargs: object) -> None:
        Path(target).mkdir()
        (Path(target) / "a.py").write_text("x = 1\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "write_plugin", write_plugin)
    monkeypatch.setattr(command.shutil, "copytree", stopped_mid_copy)
    dest = tmp_path / "out" / "plugin"
    with pytest.raises(KeyboardInterrupt):
        command._finish(None, tmp_path / "staging", dest)  # type: ignore[arg-type]
    assert list((tmp_path / "out").iterdir()) == []
    monkeypatch.undo()
    monkeypatch.setattr(command, "write_plugin", write_plugin)
    command._finish(None, tmp_path / "staging", dest)  # type: ignore[arg-type]
    assert sorted(p.name for p in (dest / "pkg").iterdir()) == ["a.py", "b.py"]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["plugin"]
