"""NVIDIA/Megatron-LM#7466 (open; issues #7464, #737): label smoothing over the whole vocabulary.

With ``label_smoothing > 0`` and tensor parallel size > 1, megatron-core's (up to 0.19.2)
``_VocabParallelCrossEntropy.forward`` smooths with each rank's vocabulary partition as if
it were the whole vocabulary (its size in the coefficient, the mean log-probability of its
own slice): the ranks disagree on the loss, none has the right one, and the gradients are
wrong (the partition's size is saved for backward). Nothing raises.

The bug shows only across ranks, so the sniff runs a two-rank gloo group on CPU: two child
interpreters (``_vocab_parallel_child``) meeting at a file store in a private folder (no
port is chosen), each judging the installed forward and the vendored one against a
single-process float64 reference. Where the zygote runs (``interpreter.zygote``: torch
imported once; ``check`` and ``apply`` start it for this sniff) and can stand for a fresh
interpreter, both ranks are forked from it, else both start as fresh interpreters; either
way each leads a process group of its own, killed whole when its peer fails or the time
runs out. The ranks still cost seconds (two imports of megatron, or of torch and megatron),
so the entry's sniff runs ``on_demand``: under ``backports check`` and ``backports apply``
only, its proof kept in the proof store; ``status`` and a job's processes read the proof
and, where none is stored, say "not yet checked" instead of starting the ranks.
"""

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from packaging.version import Version

from ..interpreter import zygote
from ..model import (
    VENDOR_PACKAGE,
    BackportSpec,
    Resolved,
    ResolvedTarget,
    SniffFailed,
    SniffResult,
    Target,
    recorded_as,
)

_MODULE = "megatron.core.tensor_parallel.cross_entropy"
_VENDORED = f"{VENDOR_PACKAGE}.megatron_lm_7466.cross_entropy"
_CHILD = Path(__file__).with_name("_vocab_parallel_child.py")
_RANKS = 2
_CHILD_TIMEOUT_S = 600
# float32 ranks against a float64 reference: 1e-6 apart when right; 0.2 and 0.02 apart
# (loss, gradient) on 0.19.2.
_TOLERANCE = 1e-4
_CONTROL, _SMOOTHED = "0.0", "0.1"

# Per rank, per smoothing: {"loss_error", "grad_error", "finite"} (the children's JSON).
RankRuns = list[dict[str, dict[str, Any]]]


def _file_of(module_name: str) -> str | None:
    """The module's file as this process finds it, imported or not."""
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    if module is None:
        try:
            spec = importlib.util.find_spec(module_name)
        except ImportError:
            spec = None
        path = spec.origin if spec is not None else None
    return os.path.realpath(path) if path else None


def _source_file(target: ResolvedTarget) -> str:
    """The file a child loads ``target.original`` from: megatron's module (the installed
    forward), the vendored module (a copy of its function stands in for it), or a vendored
    folder's candidate (one with its ``UPSTREAM.toml``: what ``backports sync`` stages). A
    forward from anywhere else cannot be run in a child."""
    code = getattr(target.original, "__code__", None)
    filename = os.path.realpath(code.co_filename) if code is not None else ""
    known = {_file_of(target.module.__name__), _file_of(_VENDORED)}
    if filename and (filename in known or Path(filename).with_name("UPSTREAM.toml").is_file()):
        return filename
    raise SniffFailed(
        f"the forward judged comes from {filename or repr(target.original)}: the two-rank "
        "sniff runs only megatron's installed forward or the vendored one"
    )


def _rank_command(request: dict[str, Any]) -> list[str]:
    return [sys.executable, "-I", str(_CHILD), json.dumps(request)]


def _environment() -> dict[str, str]:
    """This process's environment, the backports off; gloo on the loopback interface
    where there is one and the user chose none (a host name that does not resolve to this
    machine cannot stop two ranks on it from meeting)."""
    env = {**os.environ, "MEGATRON_BACKPORTS": "0"}
    if "GLOO_SOCKET_IFNAME" not in env and os.path.isdir("/sys/class/net/lo"):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


class _Rank(Protocol):
    """A rank's process: a fresh interpreter's ``Popen`` (``_Started``) or the zygote's
    grandchild (``zygote.Spawned``); ``kill`` ends its whole process group."""

    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


class _Started:
    """A rank started as a fresh interpreter, leading a process group of its own; its
    output in the files ``out-N`` and ``err-N`` of the private folder."""

    def __init__(self, command: list[str], folder: Path, rank: int) -> None:
        self.folder, self.rank = folder, rank
        with (folder / f"out-{rank}").open("w") as out, (folder / f"err-{rank}").open("w") as err:
            self.process = subprocess.Popen(
                command, cwd=folder, env=_environment(), stdout=out, stderr=err, process_group=0
            )
        self.returncode: int | None = None

    def poll(self) -> int | None:
        self.returncode = self.process.poll()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self.returncode = self.process.wait(timeout)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            zygote.kill_group(self.process.pid)

    @property
    def stdout(self) -> str:
        return (self.folder / f"out-{self.rank}").read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return (self.folder / f"err-{self.rank}").read_text(errors="replace")


def _start_ranks(requests: list[dict[str, Any]], folder: Path) -> list[Any]:
    """The ranks forked from the running zygote where it can stand for fresh interpreters
    (both, or neither: two ranks must see the same megatron), else started fresh."""
    spawned: list[zygote.Spawned] = []
    source = _CHILD.read_text(encoding="utf-8")
    for request in requests:
        one = zygote.spawn(
            source,
            str(_CHILD),
            [str(_CHILD), json.dumps(request)],
            path=request["sys_path"],
            env=_environment(),
            ready_within=_CHILD_TIMEOUT_S,
        )
        if one is None:
            _end(spawned)
            break
        spawned.append(one)
    if len(spawned) == len(requests):
        return spawned
    return [_Started(_rank_command(request), folder, request["rank"]) for request in requests]


def run_two_ranks(sets: dict[str, str]) -> dict[str, Any]:
    """Each set (label -> the file of a forward) judged by two gloo ranks on CPU, in two
    fresh interpreters or two forks of the zygote that stand for them (``-I``, a private
    working folder, this process's ``sys.path``, the backports off):
    ``{"sets": {label: [rank 0's runs, rank 1's]}, "megatron": path}``."""
    searched = [entry for entry in sys.path if entry]
    with tempfile.TemporaryDirectory(prefix="megatron-backports-7466-") as name:
        folder = Path(name)
        requests = [
            {"sys_path": searched, "rank": rank, "store": str(folder / "store"), "sets": sets}
            for rank in range(_RANKS)
        ]
        ranks = _start_ranks(requests, folder)
        try:
            _wait_for(ranks)
        finally:  # interrupted: no rank is left waiting for its peer
            _end(ranks)
        # A rank that failed first: the one that ended its peer says why.
        order = sorted(range(_RANKS), key=lambda rank: ranks[rank].returncode in (0, -9))
        said = {rank: _answer(rank, ranks[rank]) for rank in order}
        answers = [said[rank] for rank in range(_RANKS)]
    return {
        "sets": {label: [answer["sets"][label] for answer in answers] for label in sets},
        "megatron": answers[0].get("megatron"),
    }


def _end(ranks: Sequence[_Rank]) -> None:
    """Each rank still running killed with its process group, and waited for."""
    for process in ranks:
        if process.poll() is None:
            process.kill()
            process.wait()


def _wait_for(ranks: Sequence[_Rank]) -> None:
    """Until every rank has ended; one that fails, or the time limit, ends the others (a
    rank alone would wait for its peer)."""
    deadline = time.monotonic() + _CHILD_TIMEOUT_S
    while any(process.poll() is None for process in ranks):
        failed = any(process.poll() not in (None, 0) for process in ranks)
        if failed or time.monotonic() > deadline:
            _end(ranks)
            return
        time.sleep(0.1)


def _answer(rank: int, process: Any) -> dict[str, Any]:
    """What one rank printed, or why it said nothing."""
    out, err = str(process.stdout), str(process.stderr)
    lines = [line for line in out.splitlines() if line.startswith("SNIFF ")]
    if process.returncode != 0 or len(lines) != 1:
        tail = (err or out).strip().splitlines()[-1:] or ["no output"]
        why = "was stopped" if process.returncode in (-9, None) else f"exited {process.returncode}"
        raise SniffFailed(f"rank {rank} of the two-rank child {why}: {tail[0]}")
    return json.loads(lines[0][len("SNIFF ") :])  # type: ignore[no-any-return]


# What the ranks saw of a forward, per (its file and that file's sha256, megatron's module
# file, interpreter, sys.path): the children cost two imports of torch and megatron, and
# their outcome depends on nothing else. One run judges the installed and vendored forwards.
_SEEN: dict[tuple[object, ...], Any] = {}
_ASKING = threading.Lock()


def _sha256(path: str | None) -> str | None:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None


def _key(file: str) -> tuple[object, ...]:
    megatron = _file_of(_MODULE)
    return (file, _sha256(file), megatron, _sha256(megatron), sys.executable, tuple(sys.path))


def _seen(file: str) -> Any:
    """The two ranks' runs of the forward in ``file`` (with the vendored one's, or the
    installed one's, in the same children: the probe asks for both)."""
    with _ASKING:
        if _key(file) not in _SEEN:
            others = [f for f in (_file_of(_MODULE), _file_of(_VENDORED)) if f and f != file]
            sets = {"asked": file, **{f"other{i}": f for i, f in enumerate(others)}}
            answer = run_two_ranks(sets)
            for label, asked in sets.items():
                _SEEN[_key(asked)] = {"runs": answer["sets"][label], "megatron": answer["megatron"]}
        seen = json.loads(json.dumps(_SEEN[_key(file)]))
    errors = [run["error"] for run in seen["runs"] if "error" in run]
    if errors:
        raise SniffFailed(f"the two-rank child could not run it: {errors[0]}")
    return seen


def _right(runs: RankRuns, smoothing: str) -> bool:
    return all(
        run[smoothing]["finite"]
        and run[smoothing]["loss_error"] < _TOLERANCE
        and run[smoothing]["grad_error"] < _TOLERANCE
        for run in runs
    )


def _judge(runs: RankRuns) -> SniffResult:
    """Fixed iff with smoothing 0.1 both ranks have the reference's loss and gradient;
    needed iff not; raises when without smoothing (every version is right) they differ."""
    detail = {"ranks": runs}
    if not _right(runs, _CONTROL):
        raise SniffFailed(
            f"without label smoothing the two ranks differ from the reference: {runs}"
        )
    if _right(runs, _SMOOTHED):
        summary = (
            "with label smoothing 0.1 over 2 ranks, loss and gradients equal the "
            "single-process reference"
        )
        return SniffResult(True, summary, detail)
    errors = [(run[_SMOOTHED]["loss_error"], run[_SMOOTHED]["grad_error"]) for run in runs]
    loss_error = max(loss for loss, _ in errors)
    grad_error = max(grad for _, grad in errors)
    summary = (
        "with label smoothing 0.1 over 2 ranks (TP=2), each rank smooths over its own "
        f"vocabulary slice: loss off by up to {loss_error:.3g}, gradients by {grad_error:.3g} "
        "(against a single-process reference)"
    )
    return SniffResult(False, summary, detail)


def _sniff(targets: Sequence[Resolved]) -> SniffResult:
    (target,) = recorded_as(targets, ResolvedTarget)
    seen = _seen(_source_file(target))
    result = _judge(seen["runs"])
    return SniffResult(
        result.fixed, result.summary, {**result.detail, "megatron": seen["megatron"]}
    )


SPEC = BackportSpec(
    id="megatron-lm-7466",
    title="Vocab-parallel cross entropy: label smoothing over the whole vocabulary",
    targets=(
        Target(
            distribution="megatron-core",
            modules=(_MODULE,),
            # A @staticmethod of a torch.autograd.Function; its backward reads the size
            # this forward saves, so the fixed forward alone fixes the gradients too.
            attribute="_VocabParallelCrossEntropy.forward",
            parameters=("ctx", "vocab_parallel_logits", "target", "label_smoothing", "tp_group"),
            helpers=(
                "VocabParallelCrossEntropy",
                "VocabUtility",
                "get_tensor_model_parallel_group",
                "get_pg_rank",
                "get_pg_size",
            ),
        ),
    ),
    # The class (label smoothing with the partition's size included) is megatron-core's from
    # its start; the forward the entry is written for (tp_group, get_pg_rank) arrives in 0.19
    # (#5128): on older releases, which have the bug, the entry is incompatible.
    target_since=Version("0.1"),
    # The pull request is open: no release carries it.
    fixed_in=None,
    sniff=_sniff,
    sniff_in_child=True,
    sniff_on_demand=True,
)
