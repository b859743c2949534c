"""``backports upstream-tests``: upstream's own tests, checked out of a clone at a commit and
run stock and with the backport.

The upstream repository is built here with gitpython and holds test files written the way
upstream writes them (``tests/unit_tests/...``, a helper module the test imports, a class
``TestTop2Router``), this project's own small tests of #6114's behaviour on the installed
megatron-core 0.19.2. The harness test below rendezvouses the way upstream's
``Utils.initialize_distributed`` does (LOCAL_RANK, MASTER_ADDR / MASTER_PORT), over gloo.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import git
import pytest

from backports.megatron import cli
from backports.megatron.upstream_tests import Row, verdict
from backports.megatron.upstream_tests.judgement import NOTHING, PROVES, document, judge, markdown
from tests.paths import ROOT
from tests.sync.upstreams import commit_files


@pytest.fixture(autouse=True)
def private_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Temporary folders, ours and the children's (pytest, torchrun), in a fresh folder of
    pytest's own. Short (``.../tmp3``, not the test's ``.../test_<name>_0/tmp``): a Unix
    socket's path holds at most 107 bytes, and multiprocessing's Manager (megatron's
    checkpoint writer starts one) binds one two folders below it; under pytest-xdist's
    ``popen-gwN`` folder the test's own was one byte too long."""
    scratch = tmp_path_factory.mktemp("tmp")
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    return scratch


NODE = (
    "tests/unit_tests/transformer/moe/test_routers.py::TestTop2Router::"
    "test_expert_bias_token_counts_with_padding_mask"
)
HELPER = '''\
import torch


def routing_map_for(tokens, experts):
    """Token t routed to expert t % experts."""
    routing_map = torch.zeros(tokens, experts, dtype=torch.bool)
    for token in range(tokens):
        routing_map[token, token % experts] = True
    return routing_map
'''
TEST = """\
import os

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # on CPU the compiled method runs eagerly

from types import SimpleNamespace

import pytest
import torch

from megatron.core.transformer.moe.router import TopKRouter
from tests.unit_tests.test_utilities import routing_map_for


class TestTop2Router:
    @pytest.mark.parametrize("with_padding_mask", [True])
    def test_expert_bias_token_counts_with_padding_mask(self, with_padding_mask):
        router = SimpleNamespace(enable_expert_bias=True, local_tokens_per_expert=torch.zeros(4))
        padding = torch.tensor([False, False, False, False, True, True])
        TopKRouter._apply_expert_bias(router, routing_map_for(6, 4), padding_mask=padding)
        assert router.local_tokens_per_expert.tolist() == [1, 1, 1, 1]

    def test_counts_without_a_mask(self):
        router = SimpleNamespace(enable_expert_bias=True, local_tokens_per_expert=torch.zeros(4))
        TopKRouter._apply_expert_bias(router, routing_map_for(4, 4))
        assert router.local_tokens_per_expert.tolist() == [1, 1, 1, 1]
"""


def test_the_verdict_needs_a_failure_on_stock_and_none_with_the_backport() -> None:
    assert verdict([Row("t", "failed", "passed")])[0] == 0
    assert verdict([Row("t", "passed", "passed")])[0] == 1  # proves nothing
    assert verdict([Row("t", "failed", "failed")])[0] == 1
    assert verdict([Row("t", "skipped", "skipped")]) == (
        1,
        "every upstream test was skipped here: they prove nothing (see the notes)",
    )
    assert verdict([Row("t", "failed", "passed"), Row("u", "skipped", "skipped")])[0] == 0
    assert verdict([Row("t", "not run", "not run")])[0] == 1


@pytest.mark.slow
def test_upstream_tests_of_6114_fail_stock_and_pass_with_the_backport(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = git.Repo.init(tmp_path / "Megatron-LM")
    files = {
        "tests/__init__.py": "",
        "tests/unit_tests/__init__.py": "",
        "tests/unit_tests/test_utilities.py": HELPER,
        "tests/unit_tests/transformer/moe/test_routers.py": TEST,
    }
    sha = commit_files(repo, files, "tests: expert bias counts", None)
    args = ["upstream-tests", "megatron-lm-6114", "--repo", str(tmp_path / "Megatron-LM")]
    code = cli.main([*args, "--sha", sha])
    out = capsys.readouterr().out
    assert f"{NODE}[True]  failed / passed" in out, out
    assert code == 0, out
    assert "1 test(s) fail on stock and pass with the backport" in out
    # Only the recorded node ids run: the other test in the file is not collected.
    assert "test_counts_without_a_mask" not in out


def test_a_commit_the_clone_lacks_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = git.Repo.init(tmp_path / "Megatron-LM")
    commit_files(repo, {"README": "x"}, "init", None)
    args = ["upstream-tests", "megatron-lm-6114", "--repo", str(tmp_path / "Megatron-LM")]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "has no commit 723db5a72790aefc02f5a0228e6607eef70c0533" in err
    assert err.count("\n") == 1


# ---- when a test counts (issue 33 items 19, 20) ----------------------------------------------


def test_a_test_skipped_with_the_backport_proves_nothing() -> None:
    rows = [Row("a", "failed", "skipped"), Row("b", "passed", "passed")]
    assert judge(rows[0]) == NOTHING
    assert verdict(rows)[0] == 1  # was 0: the skip counted as a pass


@pytest.mark.parametrize(
    ("stock", "backport", "judgement"),
    [
        ("failed", "passed", PROVES),
        ("error", "passed", PROVES),
        ("failed", "failed", NOTHING),
        ("error", "error", NOTHING),
        ("failed", "skipped", NOTHING),
        ("skipped", "passed", NOTHING),
        ("timed out", "passed", NOTHING),
        ("failed", "timed out", NOTHING),
        ("not run", "passed", NOTHING),
        ("passed", "passed", NOTHING),
        ("passed", "failed", "fails with the backport"),
        ("passed", "error", "fails with the backport"),
    ],
)
def test_only_failing_stock_and_passing_with_the_backport_counts(
    stock: str, backport: str, judgement: str
) -> None:
    row = Row("t", stock, backport)
    assert judge(row) == judgement
    assert verdict([row])[0] == (0 if judgement == PROVES else 1)


def test_tests_failing_alike_name_the_environment_not_the_backport() -> None:
    line = "ZeroDivisionError: integer modulo by zero"
    where = "tests/unit_tests/test_utilities.py:62"
    rows = [Row(f"t{i}", "failed", "failed", line, line, where, where) for i in range(5)]
    code, summary = verdict(rows, {"torch": "2.14.1", "cuda_devices": 0})
    assert code == 1
    assert summary == (
        "all 10 runs fail alike, stock and with the backport, in upstream's test code, "
        "tests/unit_tests/test_utilities.py:62, so they prove nothing here (this machine: "
        "torch 2.14.1, no CUDA device): ZeroDivisionError: integer modulo by zero"
    )
    assert "do not pass with the backport" not in summary


def test_runs_failing_differently_give_each_first_error() -> None:
    rows = [Row("t", "failed", "error", "AssertionError: 1 != 2", "OSError: disk full")]
    code, summary = verdict(rows, {"torch": "2.11.0", "cuda_devices": 1})
    assert code == 1
    assert "(this machine: torch 2.11.0, 1 CUDA device)" in summary
    assert summary.endswith("stock: AssertionError: 1 != 2; with the backport: OSError: disk full")


def test_a_test_failing_with_the_backport_alone_is_the_backports_fault() -> None:
    rows = [
        Row("a", "failed", "passed"),
        Row("b", "passed", "failed", "", "AssertionError: x", "", "tests/t.py:3"),
    ]
    assert verdict(rows) == (
        1,
        "1 upstream test(s) pass stock and fail with the backport: "
        "AssertionError: x (tests/t.py:3)",
    )


def test_proof_beside_tests_that_prove_nothing_says_both() -> None:
    rows = [Row("a", "failed", "passed"), Row("b", "skipped", "skipped", "skipped: CUDA")]
    assert verdict(rows) == (
        0,
        "1 test(s) fail on stock and pass with the backport; 1 prove nothing here",
    )


def _document(rows: list[Row]) -> dict:
    return document(
        "megatron-lm-5077",
        rows,
        commit="32a03b77c560f5f90115d49b59e4f1809a34726f",
        launcher="torchrun",
        timeout_s=120.0,
        environment={"torch": "2.11.0", "cuda_devices": 1},
        notes=[],
    )


def test_markdown_gives_the_first_error_line_of_each_test_that_proves_nothing() -> None:
    doc = _document(
        [
            Row("t::a", "failed", "passed", "AssertionError: lost", "", "tests/t.py:9"),
            Row("t::b", "failed", "failed", *["KeyError: 'x'"] * 2, *["tests/u.py:1"] * 2),
            Row("t::c", "skipped", "timed out", "skipped: needs TE", ""),
        ]
    )
    table = markdown([json.loads(json.dumps(doc))])  # what a reader of the JSON file has
    lines = table.splitlines()
    assert lines[0] == "| backport | test | stock | backport | judgement | first error line |"
    assert lines[2] == "| megatron-lm-5077 | t::a | failed | passed | proves the fix |  |"
    assert lines[3] == (
        "| megatron-lm-5077 | t::b | failed | failed | proves nothing here | "
        "KeyError: 'x' (tests/u.py:1) |"
    )
    assert lines[4].endswith("| proves nothing here | stock: skipped: needs TE |")
    assert lines[6] == (
        "- megatron-lm-5077 at 32a03b77c560 (torchrun; torch 2.11.0, 1 CUDA device): exit 0, "
        "1 test(s) fail on stock and pass with the backport; 2 prove nothing here"
    )


# ---- one line for bad input (issue 33 item 21) -----------------------------------------------


def _one_line_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert cli.main(["upstream-tests", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_a_folder_that_is_not_a_git_repository_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    git.Repo.init(tmp_path / "outer")  # a repository above it is not the folder's own
    plain = tmp_path / "outer" / "plain"
    plain.mkdir()
    err = _one_line_error(capsys, "megatron-lm-6114", "--repo", str(plain))
    assert err == (
        f"backports: --repo {plain} is not a git repository (point it at a Megatron-LM clone)\n"
    )


def test_a_missing_commit_is_said_without_python_reprs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = git.Repo.init(tmp_path / "Megatron-LM")
    commit_files(repo, {"README": "x"}, "init", None)
    err = _one_line_error(capsys, "megatron-lm-7617", "--repo", str(tmp_path / "Megatron-LM"))
    sha = "3d07347181ae6d34ab7d381b586a81b39a2e6c23"
    assert f"has no commit {sha} (fetch it into that clone first: git -C " in err
    assert "b'" not in err


def test_an_unknown_id_lists_the_known_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _one_line_error(capsys, "megatron-lm-1", "--repo", str(tmp_path))
    assert err.startswith("backports: unknown backport 'megatron-lm-1'; known: megatron-lm-7617, ")
    assert "megatron-lm-5077" in err and "megatron-lm-6114" in err


# ---- the runs: harness, time limit, SIGTERM (slow: each starts pytest children) ---------------

HARNESS = (
    HELPER
    + '''

def initialize_distributed():
    """Join the process group the way upstream's harness does: LOCAL_RANK, and a tcp://
    rendezvous at MASTER_ADDR:MASTER_PORT (torchrun's own store), here over gloo."""
    import os
    from datetime import timedelta

    from torch.distributed import rendezvous

    if torch.distributed.is_initialized():
        return
    rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    address = os.getenv("MASTER_ADDR", "localhost") + ":" + os.getenv("MASTER_PORT", "29500")
    store, rank, world_size = next(
        rendezvous("tcp://" + address, rank, world_size, timeout=timedelta(minutes=1))
    )
    torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
'''
)
TEST_IN_HARNESS = TEST.replace(
    "from tests.unit_tests.test_utilities import routing_map_for",
    "from tests.unit_tests.test_utilities import initialize_distributed, routing_map_for",
).replace(
    "    def test_expert_bias_token_counts_with_padding_mask(self, with_padding_mask):\n",
    "    def test_expert_bias_token_counts_with_padding_mask(self, with_padding_mask):\n"
    "        initialize_distributed()\n"
    "        assert torch.distributed.get_world_size() == 1\n",
)
STALLS_STOCK = """\
import os
import time

import pytest


class TestTop2Router:
    @pytest.mark.parametrize("case", ["quick", "stalls"])
    def test_expert_bias_token_counts_with_padding_mask(self, case):
        if case == "stalls" and os.environ.get("MEGATRON_BACKPORTS") == "0":
            with open(os.environ["FIXTURE_PID_FILE"], "w") as handle:
                handle.write(str(os.getpid()))
            time.sleep(600)
"""
TEST_FILE = "tests/unit_tests/transformer/moe/test_routers.py"


def _upstream(tmp_path: Path, test: str, helper: str = HELPER) -> tuple[str, str]:
    """A clone holding ``test`` as #6114's recorded test file: (its path, the commit)."""
    repo = git.Repo.init(tmp_path / "Megatron-LM")
    files = {
        "tests/__init__.py": "",
        "tests/unit_tests/__init__.py": "",
        "tests/unit_tests/test_utilities.py": helper,
        TEST_FILE: test,
    }
    return str(tmp_path / "Megatron-LM"), commit_files(repo, files, "tests", None)


def _json_run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code = cli.main(["upstream-tests", "megatron-lm-6114", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_upstreams_harness_runs_under_torchrun_and_not_without(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo, sha = _upstream(tmp_path, TEST_IN_HARNESS, HARNESS)
    code, doc = _json_run(capsys, "--repo", repo, "--sha", sha)
    assert code == 1
    assert [(t["stock"], t["backport"]) for t in doc["tests"]] == [("failed", "failed")]
    assert doc["tests"][0]["stock_error"] == "KeyError: 'LOCAL_RANK'"
    assert doc["tests"][0]["stock_where"].startswith("tests/unit_tests/test_utilities.py:")
    assert doc["summary"].startswith("all 2 runs fail alike, stock and with the backport, in ")
    assert doc["summary"].endswith(": KeyError: 'LOCAL_RANK'")

    code, doc = _json_run(capsys, "--repo", repo, "--sha", sha, "--launcher", "torchrun")
    assert code == 0, doc
    assert doc["launcher"] == "torchrun"
    assert doc["environment"]["world_size"] == 1
    assert [(t["stock"], t["backport"], t["judgement"]) for t in doc["tests"]] == [
        ("failed", "passed", PROVES)
    ]
    # 0.19.2 lines the padding mask up against the expert axis: 6 tokens, 4 experts.
    assert doc["tests"][0]["stock_error"].startswith("RuntimeError: The size of tensor a (4)")
    assert doc["tests"][0]["stock_where"].startswith("megatron/core/transformer/moe/router.py:")
    assert doc["summary"] == "1 test(s) fail on stock and pass with the backport"


@pytest.mark.slow
def test_a_run_past_its_time_limit_gives_timed_out_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, sha = _upstream(tmp_path, STALLS_STOCK)
    monkeypatch.setenv("FIXTURE_PID_FILE", str(tmp_path / "pid"))
    started = time.monotonic()
    code, doc = _json_run(capsys, "--repo", repo, "--sha", sha, "--timeout", "15")
    assert time.monotonic() - started < 120
    assert code == 1
    node = f"{TEST_FILE}::TestTop2Router::test_expert_bias_token_counts_with_padding_mask"
    assert [(t["test"], t["stock"], t["backport"]) for t in doc["tests"]] == [
        (f"{node}[quick]", "passed", "passed"),
        (f"{node}[stalls]", "timed out", "passed"),
    ]
    assert "stock: stopped at its time limit (15 s)" in doc["notes"]
    _gone(int((tmp_path / "pid").read_text()))


def _gone(pid: int) -> None:
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(f"process {pid} outlived its run")


@pytest.mark.slow
def test_sigterm_stops_the_run_and_removes_its_folder(tmp_path: Path, private_tmp: Path) -> None:
    repo, sha = _upstream(tmp_path, STALLS_STOCK)
    scratch = private_tmp
    pid_file = tmp_path / "pid"
    env = {**os.environ, "TMPDIR": str(scratch), "FIXTURE_PID_FILE": str(pid_file)}
    command = [sys.executable, "-P", "-m", "backports.megatron", "upstream-tests"]
    command += ["megatron-lm-6114", "--repo", repo, "--sha", sha]
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL)
    try:
        for _ in range(600):  # the stock run reaches the stalling test
            if pid_file.is_file() and pid_file.read_text():
                break
            time.sleep(0.1)
        assert list(scratch.glob("backports-upstream-*")), "the run's folder is not there"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == -signal.SIGTERM
    finally:
        process.kill()
    assert list(scratch.iterdir()) == []
    _gone(int(pid_file.read_text()))


def test_the_table_tool_reads_each_json_file_and_says_which_held_none(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    import upstream_tests_table

    good = tmp_path / "upstream_tests_megatron-lm-5077.json"
    good.write_text(json.dumps(_document([Row("t::a", "failed", "passed")])))
    empty = tmp_path / "upstream_tests_megatron-lm-6114.json"  # the command ended in an error
    empty.write_text("")
    md = tmp_path / "upstream_tests.md"
    assert upstream_tests_table.main([str(good), str(empty), "--md", str(md)]) == 0
    lines = md.read_text().splitlines()
    assert lines[2] == "| megatron-lm-5077 | t::a | failed | passed | proves the fix |  |"
    assert lines[-1].startswith(
        "- upstream_tests_megatron-lm-6114.json: no result (JSONDecodeError"
    )


# ---- a crafted clone: tree entries git never writes (issue 42) ------------------------------


def _git(repo: Path, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], input=stdin, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def _tree(repo: Path, entries: dict[str, tuple[str, str]]) -> str:
    """``git mktree``, which, unlike a checkout or fsck, takes any entry name."""
    lines = "".join(f"{mode} {kind} {sha}\t{name}\n" for name, (mode, kind, sha) in entries.items())
    return _git(repo, "mktree", stdin=lines)


def test_a_tree_entry_climbing_out_of_the_folder_is_refused_and_nothing_written(
    tmp_path: Path, private_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tests/../../../escaped.py``: written as is, it lands beside the temporary folder,
    outside it. Refused in one line, exit 2, before anything is written."""
    repo = tmp_path / "Megatron-LM"
    git.Repo.init(repo)

    def blob(text: str) -> tuple[str, str]:
        return ("100644", "blob", _git(repo, "hash-object", "-w", "--stdin", stdin=text))

    def tree(entries: dict[str, tuple[str, str]]) -> tuple[str, str]:
        return ("040000", "tree", _tree(repo, entries))

    climb = tree({"escaped.py": blob("open('ESCAPED', 'w')\n")})
    for _ in range(2):
        climb = tree({"..": climb})
    moe = tree({"test_routers.py": blob(TEST)})
    unit = tree({"transformer": tree({"moe": moe}), "test_utilities.py": blob(HELPER)})
    root = _tree(repo, {"tests": tree({"unit_tests": unit, "..": climb})})
    who = {"GIT_AUTHOR_NAME": "F", "GIT_AUTHOR_EMAIL": "f@x", "GIT_COMMITTER_NAME": "F"}
    env = {**os.environ, **who, "GIT_COMMITTER_EMAIL": "f@x"}
    sha = subprocess.run(
        ["git", "-C", str(repo), "commit-tree", root, "-m", "crafted"],
        capture_output=True, text=True, check=True, env=env,
    ).stdout.strip()  # fmt: skip
    assert "tests/../../../escaped.py" in _git(repo, "ls-tree", "-r", "--name-only", sha)

    args = ["upstream-tests", "megatron-lm-6114", "--repo", str(repo), "--sha", sha]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'tests/../../../escaped.py'" in err, err
    assert "crafted clone, refused (nothing written)" in err
    assert list(private_tmp.iterdir()) == []
    assert not [p for p in tmp_path.rglob("escaped.py")]


# ---- offline (issue 44 item 6) -----------------------------------------------------------------

OFFLINE_PROBE = """\
import os
import socket

os.environ["BACKPORTS_UPSTREAM_TESTS_OFFLINE"] = "1"
os.environ["PYTEST_CURRENT_TEST"] = "tests/test_x.py::test_y (call)"
import backports.megatron._apply_for_pytest as plugin

server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
socket.create_connection(server.getsockname(), timeout=5).close()
print("loopback: ok")
for address in (("192.0.2.1", 80), ("::ffff:192.0.2.1", 80)):
    family = socket.AF_INET if "." in address[0] and ":" not in address[0] else socket.AF_INET6
    try:
        socket.socket(family).connect(address)
    except ConnectionRefusedError as exc:
        print("refused:", exc.strerror)
try:
    socket.getaddrinfo("example.com", 443)
except ConnectionRefusedError as exc:
    print("lookup refused:", exc.strerror)
print("localhost:", bool(socket.getaddrinfo("localhost", 80)))
print("who:", plugin._network)
"""


def test_the_plugin_refuses_every_connection_but_loopbacks(tmp_path: Path) -> None:
    """What ``upstream-tests`` children run with: a connect or a name lookup off this
    machine fails at once, saying the test needs the network; loopback works."""
    done = subprocess.run(
        [sys.executable, "-P", "-c", OFFLINE_PROBE],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    said = "needs the network: backports upstream-tests runs offline (a connection to "
    assert lines == [
        "loopback: ok",
        f"refused: {said}192.0.2.1:80)",
        f"refused: {said}::ffff:192.0.2.1:80)",
        f"lookup refused: {said}example.com:443)",
        "localhost: True",
        "who: {'tests/test_x.py::test_y': '192.0.2.1:80'}",
    ]


DOWNLOADS = """\
import urllib.request

try:  # as upstream's conftest.py fetches a data set when it can
    urllib.request.urlopen("https://example.com/dataset.json", timeout=5)
except OSError:
    pass
"""
NEEDS_THE_NETWORK = """\
import urllib.request


class TestTop2Router:
    def test_expert_bias_token_counts_with_padding_mask(self):
        urllib.request.urlopen("https://example.com/tokenizer.json", timeout=5)
"""


@pytest.mark.slow
def test_a_test_that_needs_the_network_is_reported_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = git.Repo.init(tmp_path / "Megatron-LM")
    files = {
        "tests/__init__.py": "",
        "tests/unit_tests/__init__.py": "",
        "tests/unit_tests/conftest.py": DOWNLOADS,
        TEST_FILE: NEEDS_THE_NETWORK,
    }
    sha = commit_files(repo, files, "tests", None)
    code, doc = _json_run(capsys, "--repo", str(tmp_path / "Megatron-LM"), "--sha", sha)
    assert code == 1
    [row] = doc["tests"]
    assert (row["stock"], row["backport"], row["judgement"]) == ("failed", "failed", NOTHING)
    assert row["stock_error"].startswith(
        "needs the network (a connection to example.com:443; upstream-tests runs offline)"
    ), row
    assert "stock: 2 test(s) or the collection need the network (refused: example.com:443)" in (
        " ".join(doc["notes"])
    )
