"""megatron-lm-7466 (open PR): vocab-parallel cross entropy smooths labels over the whole
vocabulary under tensor parallel size > 1.

megatron-core 0.19.2's real ``vocab_parallel_cross_entropy`` runs here on two gloo ranks on
CPU (two processes forked from the test, meeting at a file store in ``tmp_path``: no port),
each holding half of an 8-id vocabulary, before apply, after it and after revert. The
expected loss and gradients come from a reference written here: the whole vocabulary in one
process, float64, ``log_softmax`` against the label-smoothed target distribution (1 - alpha
on the label, alpha / (V - 1) elsewhere), the gradient by autograd.

The entry's sniff starts two child interpreters (seconds): only ``check`` and ``apply()``
run it; ``status`` reads its proof, or says "not yet checked". The tests that run it are
slow; the others store a proof as ``check`` would, or watch that nothing starts the ranks.
"""

import dataclasses
import multiprocessing
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist

from backports.megatron import Action, Verdict, apply, revert, status
from backports.megatron.api import apply_in_job
from backports.megatron.catalog import _checks, by_id, megatron_lm_7466
from backports.megatron.decision import cache_key, verdict_cache
from backports.megatron.model import UPSTREAM_ONLY, WITH_LOCAL_CHANGES, SniffFailed, SniffResult
from tests.reports import report_for

ID = "megatron-lm-7466"
ENTRY = by_id(ID)
_SEQ, _BATCH, _VOCAB, _RANKS = 3, 2, 8, 2
_ALPHA = 0.1
_FORK_TIMEOUT_S = 120
_SLOW_WHY = "starts the entry's two-rank sniff: two interpreters importing megatron (~40 s)"


@pytest.fixture(scope="module")
def cross_entropy() -> ModuleType:
    import megatron.core.tensor_parallel.cross_entropy as module

    return module


def _inputs() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(12)
    return {
        "logits": torch.randn(_SEQ, _BATCH, _VOCAB, generator=generator, dtype=torch.float64) * 2,
        "labels": torch.randint(0, _VOCAB, (_SEQ, _BATCH), generator=generator),
        "grad_output": torch.rand(_SEQ, _BATCH, generator=generator, dtype=torch.float64) + 0.5,
    }


def _reference(data: dict[str, torch.Tensor], alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss against the smoothed target distribution, and d(sum(loss * g))/dz."""
    logits = data["logits"].clone().requires_grad_(True)
    log_probs = torch.log_softmax(logits, dim=-1)
    smoothed = torch.full_like(log_probs, alpha / (_VOCAB - 1))
    smoothed.scatter_(-1, data["labels"].unsqueeze(-1), 1.0 - alpha)
    loss = -(smoothed * log_probs).sum(dim=-1)
    (loss * data["grad_output"]).sum().backward()
    assert logits.grad is not None
    return loss.detach(), logits.grad


def _one_rank(rank: int, store: str, alpha: float, answers: Any) -> None:
    """In a forked process: megatron's function on this rank's half of the vocabulary."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=_RANKS)
    try:
        from megatron.core import tensor_parallel

        data = _inputs()
        width = _VOCAB // _RANKS
        shard = data["logits"][..., rank * width : (rank + 1) * width].float()
        shard.requires_grad_(True)
        loss = tensor_parallel.vocab_parallel_cross_entropy(
            shard * 1.0, data["labels"], alpha, dist.group.WORLD
        )
        (loss * data["grad_output"].float()).sum().backward()
        answers.put((rank, loss.detach().double().tolist(), shard.grad.double().tolist()))
    finally:
        dist.destroy_process_group()


def _two_ranks(folder: Path, alpha: float = _ALPHA) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each rank's loss, and the gradient over the whole vocabulary (the ranks' halves)."""
    assert not dist.is_initialized(), "a process group is left from another test"
    context = multiprocessing.get_context("fork")  # the ranks see what this process installed
    answers = context.SimpleQueue()
    store = str(folder / f"store-{len(list(folder.iterdir()))}")
    ranks = [context.Process(target=_one_rank, args=(r, store, alpha, answers)) for r in range(2)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(_FORK_TIMEOUT_S)
        assert process.exitcode == 0, f"a rank exited {process.exitcode}"
    by_rank = dict((rank, (loss, grad)) for rank, loss, grad in (answers.get() for _ in ranks))
    losses = [torch.tensor(by_rank[rank][0], dtype=torch.float64) for rank in range(_RANKS)]
    halves = [torch.tensor(by_rank[rank][1], dtype=torch.float64) for rank in range(_RANKS)]
    return losses, torch.cat(halves, dim=-1)


def _matches_reference(folder: Path, alpha: float = _ALPHA) -> bool:
    """Whether both ranks have the reference's loss, and the gradient is the reference's."""
    losses, grad = _two_ranks(folder, alpha)
    expected_loss, expected_grad = _reference(_inputs(), alpha)
    close = all(torch.allclose(loss, expected_loss, atol=1e-5) for loss in losses)
    return close and torch.allclose(grad, expected_grad, atol=1e-5)


def _store_a_proof(monkeypatch: pytest.MonkeyPatch, folder: Path, reason: str) -> None:
    """A proof in a store of the test's own, as ``backports check`` keeps it for 0.19.2."""
    monkeypatch.setenv(verdict_cache.CACHE, "1")
    monkeypatch.setenv(verdict_cache.CACHE_DIR, str(folder))
    key = cache_key(ENTRY)
    assert key is not None
    # A needed proof says the vendored forward was shown fixed in each mode.
    shown = {mode: {"fixed": True} for mode in (UPSTREAM_ONLY, WITH_LOCAL_CHANGES)}
    verdict_cache.store(ENTRY, key, "needed", reason, {"vendored_behaviour": shown})


def _no_ranks_started(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Any start of the two-rank child is recorded and fails the sniff (no memo either)."""
    started: list[object] = []

    def refuse(sets: object) -> object:
        started.append(sets)
        raise AssertionError("the two-rank child was started")

    monkeypatch.setattr(megatron_lm_7466, "run_two_ranks", refuse)
    monkeypatch.setattr(megatron_lm_7466, "_SEEN", {})
    return started


# --- megatron's own function on two ranks: before apply, after it, after revert ----------------


def test_real_function_on_two_ranks_is_wrong_then_right_then_original_again(
    cross_entropy, monkeypatch, tmp_path
):
    """0.19.2 has the bug; a job's process that reads the proof ``check`` kept installs the
    forward; revert puts back the very object the class held."""
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    original = vars(cross_entropy._VocabParallelCrossEntropy)["forward"]
    assert _matches_reference(ranks, alpha=0.0)  # the control: no smoothing is right
    assert not _matches_reference(ranks)
    _store_a_proof(monkeypatch, tmp_path / "proofs", "megatron-core 0.19.2 lacks the fix (kept)")
    started = _no_ranks_started(monkeypatch)
    report = report_for(apply_in_job((ID,)), ID)
    try:
        assert (report.verdict, report.action) == (Verdict.NEEDED, Action.INSTALLED), report
        forward = vars(cross_entropy._VocabParallelCrossEntropy)["forward"]
        assert forward.__backport__ == ID and forward.__func__.__wrapped__ is original
        assert _matches_reference(ranks)
        assert _matches_reference(ranks, alpha=0.0)
    finally:
        report_for(revert(only=ID), ID)
    assert vars(cross_entropy._VocabParallelCrossEntropy)["forward"] is original
    assert not _matches_reference(ranks)
    assert started == []


def test_the_ranks_disagree_on_0_19_2(tmp_path):
    """Each rank smooths over its own half: the two ranks report different losses."""
    losses, _ = _two_ranks(tmp_path)
    assert not torch.allclose(losses[0], losses[1], atol=1e-3)


# --- status never starts the ranks -----------------------------------------------------------


def test_status_without_a_proof_says_not_yet_checked_and_starts_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv(verdict_cache.CACHE_DIR, str(tmp_path))  # an empty store
    started = _no_ranks_started(monkeypatch)
    report = report_for(status(only=ID), ID)
    assert started == []
    assert (report.verdict, report.action) == (Verdict.NEEDED, Action.WOULD_INSTALL)
    assert "not yet checked: run `backports check`" in report.reason
    assert "\n" not in report.reason
    assert report.evidence["behaviour"] == {"sniffed": False, "on_demand": True}


def test_status_reads_a_stored_proof(monkeypatch, tmp_path):
    _store_a_proof(monkeypatch, tmp_path, "megatron-core 0.19.2 lacks the fix (kept)")
    started = _no_ranks_started(monkeypatch)
    report = report_for(status(only=ID), ID)
    assert started == []
    assert report.reason == "megatron-core 0.19.2 lacks the fix (kept)"
    assert report.evidence["cache"]["hit"] is True


def test_a_job_without_a_proof_installs_nothing(cross_entropy, monkeypatch, tmp_path):
    monkeypatch.setenv(verdict_cache.CACHE_DIR, str(tmp_path))
    started = _no_ranks_started(monkeypatch)
    original = vars(cross_entropy._VocabParallelCrossEntropy)["forward"]
    report = report_for(apply_in_job((ID,)), ID)
    assert started == []
    assert report.action is not Action.INSTALLED
    assert "not yet checked" in report.reason
    assert vars(cross_entropy._VocabParallelCrossEntropy)["forward"] is original


# --- check and apply prove it and keep the proof -----------------------------------------------


@pytest.mark.slow(reason=_SLOW_WHY)
def test_check_and_apply_keep_the_proof_status_reads(monkeypatch, tmp_path, capsys):
    import json

    from backports.megatron import cli

    monkeypatch.setenv(verdict_cache.CACHE, "1")
    checked, applied = tmp_path / "checked", tmp_path / "applied"
    monkeypatch.setenv(verdict_cache.CACHE_DIR, str(checked))
    capsys.readouterr()
    assert cli.main(["check", "--only", ID, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    # check's own row is the proved one, not "not yet checked".
    assert "lacks the fix: with label smoothing 0.1 over 2 ranks" in row["reason"], row
    monkeypatch.setenv(verdict_cache.CACHE_DIR, str(applied))
    report = report_for(apply(only=ID), ID)  # the ranks' answer is kept in the process
    revert(only=ID)
    assert (report.verdict, report.action) == (Verdict.NEEDED, Action.INSTALLED), report
    started = _no_ranks_started(monkeypatch)
    for folder in (checked, applied):
        monkeypatch.setenv(verdict_cache.CACHE_DIR, str(folder))
        kept = report_for(status(only=ID), ID)
        assert kept.evidence["cache"]["hit"] is True, kept.reason
        assert "lacks the fix: with label smoothing 0.1 over 2 ranks" in kept.reason
    assert started == []


@pytest.mark.slow(reason=_SLOW_WHY)
def test_sniff_needed_on_installed_and_fixed_on_vendored(cross_entropy):
    from backports.megatron.decision import sniff_vendored
    from backports.megatron.kinds import kind_of
    from backports.megatron.vendored import vendored_module

    (target,) = ENTRY.targets
    resolved = kind_of(target).resolve(target, ID)
    installed = ENTRY.sniff([kind_of(target).stock(target, resolved)])
    assert installed.fixed is False
    assert "each rank smooths over its own vocabulary slice" in installed.summary
    vendored = sniff_vendored(ENTRY, vendored_module(ENTRY.vendored), upstream_only=True)
    assert vendored.fixed is True, vendored.summary


# --- the judgement on what the ranks saw -------------------------------------------------------


def _run(loss: float, grad: float, finite: bool = True) -> dict[str, Any]:
    return {"loss_error": loss, "grad_error": grad, "finite": finite}


def _ranks(control: dict[str, Any], smoothed: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"0.0": control, "0.1": smoothed}] * 2


def test_judge_fixed_needed_and_unlike_any_version():
    right = _run(1e-6, 1e-7)
    assert megatron_lm_7466._judge(_ranks(right, right)).fixed is True
    needed = megatron_lm_7466._judge(_ranks(right, _run(0.3, 0.02)))
    assert needed.fixed is False and "loss off by up to 0.3" in needed.summary
    assert megatron_lm_7466._judge(_ranks(right, _run(1e-6, 1e-7, finite=False))).fixed is False
    with pytest.raises(SniffFailed, match="without label smoothing"):
        megatron_lm_7466._judge(_ranks(_run(0.5, 0.0), right))


def test_sniff_refuses_a_forward_it_cannot_load_in_a_child(cross_entropy):
    def forward(ctx, vocab_parallel_logits, target, label_smoothing=0.0, tp_group=None):
        raise NotImplementedError

    stand_in = dataclasses.make_dataclass("Stand", ["original", "module"])(forward, cross_entropy)
    with pytest.raises(SniffFailed, match="runs only megatron's installed forward"):
        megatron_lm_7466._source_file(stand_in)


def _staged_copy(folder: Path, breaking: bool) -> Path:
    """The vendored folder copied as ``backports sync`` stages a candidate (UPSTREAM.toml
    beside it); ``breaking``: the candidate smooths with the partition's size again."""
    import shutil

    from backports.megatron.vendored import vendored_module

    source = Path(vendored_module(ENTRY.vendored).__file__).parent
    staged = shutil.copytree(source, folder / "megatron_lm_7466")
    candidate = staged / "cross_entropy.py"
    if breaking:
        text = candidate.read_text()
        wrong = text.replace("vocab_size = partition_vocab_size * world_size", "vocab_size = 4")
        assert wrong != text
        candidate.write_text(wrong)
    return candidate


def test_a_staged_sync_candidate_can_be_run_in_the_children(cross_entropy, tmp_path):
    from backports.megatron.kinds import kind_of

    (target,) = ENTRY.targets
    resolved = kind_of(target).resolve(target, ID)
    candidate = _staged_copy(tmp_path, breaking=False)
    namespace: dict[str, Any] = {}
    exec(compile(candidate.read_text(), str(candidate), "exec"), namespace)
    stand_in = dataclasses.replace(resolved, original=namespace["forward"])
    assert megatron_lm_7466._source_file(stand_in) == str(candidate.resolve())


@pytest.mark.slow(reason=_SLOW_WHY)
def test_a_sync_candidate_without_the_fix_is_judged_so(tmp_path):
    """What ``backports sync`` runs on a staged candidate: its own code on the two ranks."""
    from backports.megatron.sync import verify

    seen = verify.sniff_file(ID, _staged_copy(tmp_path, breaking=True))
    assert seen["fixed"] is False, seen
    assert "each rank smooths over its own vocabulary slice" in seen["summary"]


def test_a_rank_that_fails_ends_its_peer_and_says_why(monkeypatch):
    """Rank 1 exits at once; rank 0 would wait for it far longer than the test runs."""
    import sys
    import time

    monkeypatch.setenv("MEGATRON_BACKPORTS_ZYGOTE", "0")  # fresh interpreters: _rank_command

    def command(request: dict[str, Any]) -> list[str]:
        if request["rank"] == 1:
            return [sys.executable, "-I", "-c", "import sys; print('no peer'); sys.exit(3)"]
        return [sys.executable, "-I", "-c", "import time; time.sleep(300)"]

    monkeypatch.setattr(megatron_lm_7466, "_rank_command", command)
    started = time.monotonic()
    with pytest.raises(SniffFailed, match="rank 1 of the two-rank child exited 3: no peer"):
        megatron_lm_7466.run_two_ranks({"installed": "nowhere.py"})
    assert time.monotonic() - started < 60


def test_on_demand_needs_a_sniff_in_child():
    assert _checks.problem(ENTRY) is None
    alone = dataclasses.replace(ENTRY, sniff_in_child=False)
    assert _checks.problem(alone) == (
        "sniff_on_demand needs sniff_in_child (a sniff in this process always runs)"
    )


def test_no_megatron_core_can_read_upstream_without_evidence():
    """An open pull request: no merge to find in git, no release, no fixed text recorded."""
    from backports.megatron.vendored import read_upstream

    upstream = read_upstream(ENTRY.vendored)
    assert "merge_sha" not in upstream and "head_sha" not in upstream
    assert not upstream.get("fixed_symbols_sha256") and ENTRY.fixed_in is None


def test_a_release_whose_ranks_show_the_fix_is_drifted_not_upstream(cross_entropy):
    """Were a megatron-core's two ranks to show the fix, nothing independent would say it
    landed (no merge in git, no release, no recorded text): ``incompatible``, check by hand."""
    from backports.megatron.decision.early import early_evidence
    from backports.megatron.decision.judging import behaviour_reasons, git_evidence
    from backports.megatron.kinds import kind_of

    (target,) = ENTRY.targets
    resolved = kind_of(target).resolve(target, ID)
    evidence = early_evidence(ENTRY).evidence
    evidence["git"] = git_evidence(ENTRY, evidence)
    shown = SniffResult(True, "the ranks agree with the reference", {})
    verdict, reason = behaviour_reasons(ENTRY, shown, evidence, "megatron-core 9.9", [resolved])
    assert verdict is Verdict.INCOMPATIBLE and "drifted" in reason
    assert evidence["landed"] == {"text": {}, "git": False, "release": False}


# The contract kit: tests/catalog/test_contract.py (its checks that sniff are slow for this
# entry: two ranks in child interpreters).


# --- the ranks forked from the zygote ------------------------------------------------------------

# A stand-in for _vocab_parallel_child.py: what each rank's process is, as it starts. Each set
# names a folder; rank 0 of the set "sleeper" starts a process in its group and waits.
_STAND_IN = """
import json, os, subprocess, sys, time
torch_at_start = "torch" in sys.modules
request = json.loads(sys.argv[1])
rank = request["rank"]
seen = {
    "torch_at_start": torch_at_start, "megatron_at_start": "megatron" in sys.modules,
    "pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0), "cwd": os.getcwd(),
    "path": sys.path, "switch": os.environ.get("MEGATRON_BACKPORTS"),
}
if "sleeper" in request["sets"]:
    pid_file = os.path.join(request["sets"]["sleeper"], "grandchild.pid")
    if rank == 1:  # fails once rank 0 has started its process
        for _ in range(600):
            if os.path.exists(pid_file):
                break
            time.sleep(0.05)
        print("no peer", file=sys.stderr)
        sys.exit(3)
    child = subprocess.Popen(["sleep", "300"])
    with open(pid_file + ".part", "w") as file:
        file.write(str(child.pid))
    os.rename(pid_file + ".part", pid_file)
    time.sleep(300)
print("SNIFF " + json.dumps({"rank": rank, "sets": {k: seen for k in request["sets"]}}))
"""


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    """The ranks run _STAND_IN instead of the real child."""
    child = tmp_path / "stand_in_child.py"
    child.write_text(_STAND_IN)
    monkeypatch.setattr(megatron_lm_7466, "_CHILD", child)
    return child


# The tests that start the sniff zygote (a child importing torch: ~15 s of CPU) run in the
# slow selection; the fast one keeps the fresh-interpreter ranks and their group kill.
_STARTS_THE_ZYGOTE = pytest.mark.slow(
    reason="starts the sniff zygote (a child that imports torch: ~15 s of CPU); the fast "
    "selection keeps the fresh-interpreter ranks and their group kill"
)


@pytest.fixture
def running_zygote(monkeypatch):
    """The zygote, started as ``backports check`` starts it (torch imported once there)."""
    from backports.megatron.interpreter import children, zygote

    monkeypatch.delenv("MEGATRON_BACKPORTS_ZYGOTE", raising=False)
    zygote.start(children.child_path())
    (current,) = zygote._CURRENT
    assert current.ready.wait(120) and current.hello is not None
    return current


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaps has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@_STARTS_THE_ZYGOTE
def test_the_ranks_are_forked_from_the_running_zygote(stand_in, running_zygote):
    """Torch already imported as each rank starts (megatron not), both children of the
    zygote, each leading a process group of its own, in a private folder, on this
    process's path, the backports off."""
    answer = megatron_lm_7466.run_two_ranks({"asked": "nowhere.py"})
    ranks = answer["sets"]["asked"]
    assert [rank["torch_at_start"] for rank in ranks] == [True, True], ranks
    assert not any(rank["megatron_at_start"] for rank in ranks)
    assert {rank["ppid"] for rank in ranks} == {running_zygote.process.pid}
    assert all(rank["pgid"] == rank["pid"] for rank in ranks)
    assert ranks[0]["cwd"] != ranks[1]["cwd"] and all(
        Path(rank["cwd"]).parent.name.startswith("megatron-backports-child-") for rank in ranks
    )
    import sys

    assert all(rank["path"] == [e for e in sys.path if e] for rank in ranks)
    assert {rank["switch"] for rank in ranks} == {"0"}


def test_without_a_zygote_the_ranks_are_fresh_interpreters(stand_in, monkeypatch):
    monkeypatch.setenv("MEGATRON_BACKPORTS_ZYGOTE", "0")
    ranks = megatron_lm_7466.run_two_ranks({"asked": "nowhere.py"})["sets"]["asked"]
    assert [rank["torch_at_start"] for rank in ranks] == [False, False], ranks
    assert all(rank["pgid"] == rank["pid"] for rank in ranks)


@pytest.mark.parametrize(
    "forked", [pytest.param(True, marks=_STARTS_THE_ZYGOTE), False], ids=["zygote", "fresh"]
)
def test_a_failed_rank_ends_its_peers_whole_process_group(
    stand_in, monkeypatch, tmp_path, request, forked
):
    """Rank 1 exits 3; rank 0 (and the process it started) would run 300 s more."""
    import time

    if forked:
        request.getfixturevalue("running_zygote")
    else:
        monkeypatch.setenv("MEGATRON_BACKPORTS_ZYGOTE", "0")
    started = time.monotonic()
    with pytest.raises(SniffFailed, match="rank 1 of the two-rank child exited 3: no peer"):
        megatron_lm_7466.run_two_ranks({"sleeper": str(tmp_path)})
    assert time.monotonic() - started < 60
    pid = int((tmp_path / "grandchild.pid").read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the process rank 0 started outlived its group's kill"


@pytest.mark.slow(reason=_SLOW_WHY)
def test_the_real_ranks_forked_from_the_zygote_see_what_fresh_ones_see(
    cross_entropy, running_zygote, monkeypatch
):
    """The same runs, number for number, for the installed forward and the vendored one."""
    sets = {
        "installed": megatron_lm_7466._file_of(megatron_lm_7466._MODULE),
        "vendored": megatron_lm_7466._file_of(megatron_lm_7466._VENDORED),
    }
    forked = megatron_lm_7466.run_two_ranks(sets)
    monkeypatch.setenv("MEGATRON_BACKPORTS_ZYGOTE", "0")
    assert megatron_lm_7466.run_two_ranks(sets) == forked
    assert megatron_lm_7466._judge(forked["sets"]["installed"]).fixed is False
    assert megatron_lm_7466._judge(forked["sets"]["vendored"]).fixed is True
