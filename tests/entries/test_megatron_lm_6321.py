"""megatron-lm-6321: ``--exit-on-missing-checkpoint`` ends the job with status 1, not 0.

The target is outside ``megatron.core`` (``megatron.training.checkpointing``, shipped in the
megatron-core wheel) and the vendored code is an exit-status translation around the
installed function. The real ``_load_base_checkpoint`` of megatron-core 0.19.2 runs here on
an empty load directory with a stand-in of megatron's args, before apply, after it and
after revert; the status expected is the one a scheduler reads, written by hand.
"""

import inspect
import sys
import types
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from backports.megatron._vendor.megatron_lm_6321.checkpointing import (
    _load_base_checkpoint as vendored,
)

from backports.megatron import Action, Verdict, apply, revert, status
from backports.megatron.catalog import by_id
from backports.megatron.model import SniffFailed
from backports.megatron.private_globals import with_globals
from tests.reports import report_for
from tests.standins import recorded_as_carrying_the_fix

ID = "megatron-lm-6321"
ENTRY = by_id(ID)
NAME = "_load_base_checkpoint"
MODULE = "megatron.training.checkpointing"


@pytest.fixture(scope="module")
def checkpointing() -> types.ModuleType:
    import megatron.training.checkpointing as module

    return module


@pytest.fixture(scope="module")
def installed(checkpointing: types.ModuleType) -> Callable[..., Any]:
    return vars(checkpointing)[NAME]  # type: ignore[no-any-return]


def _args(flag: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        exit_on_missing_checkpoint=flag,
        non_persistent_global_ckpt_dir=None,
        non_persistent_ckpt_type=None,
        ckpt_step=None,
    )


def _exit_status(function: Callable[..., Any], load_dir: Path, flag: bool = True) -> object:
    """The status a process ending in ``function``'s ``SystemExit`` would have (``sys.exit()``
    and ``sys.exit(0)`` are 0), or what it returned."""
    try:
        return function(str(load_dir), _args(flag))
    except SystemExit as exc:
        return 0 if exc.code is None else exc.code


# --- the sniff ---------------------------------------------------------------------------


def test_sniff_says_needed_on_installed_0_19_2(installed):
    result = ENTRY.sniff([SimpleNamespace(original=installed, held=installed)])
    assert result.fixed is False
    assert "status 0" in result.summary
    assert result.detail["with_flag"] == repr(("SystemExit", None))


def test_sniff_says_fixed_on_vendored_code(installed):
    result = ENTRY.sniff([SimpleNamespace(original=vendored, held=installed)])
    assert result.fixed is True
    assert result.detail["with_flag"] == repr(("SystemExit", 1))


def test_sniff_leaves_the_live_module_alone(checkpointing, installed, capsys):
    before = checkpointing.get_loaded_iteration()
    ENTRY.sniff([SimpleNamespace(original=vendored, held=installed)])
    assert checkpointing.get_loaded_iteration() == before
    assert capsys.readouterr().out == ""  # its prints went to a private print_rank_0


def _exits_two(load_dir, args, *rest):
    if args.exit_on_missing_checkpoint:
        raise SystemExit(2)
    return None, "", False, None


def _always_exits(load_dir, args, *rest):
    raise SystemExit(1)


@pytest.mark.parametrize(
    ("function", "why"),
    [(_exits_two, "with the flag, an empty load directory gave"), (_always_exits, "without")],
)
def test_sniff_raises_on_a_function_unlike_any_version(installed, function, why):
    with pytest.raises(SniffFailed, match=why):
        ENTRY.sniff([SimpleNamespace(original=function, held=installed)])


def test_spec_parameters_match_installed_and_vendored(installed):
    expected = list(ENTRY.target.parameters)
    assert list(inspect.signature(installed).parameters) == expected
    assert list(inspect.signature(vendored).parameters) == expected


# --- the translation touches that one exit only ----------------------------------------------


def _run_vendored_over(stock: Callable[..., Any], iteration: object) -> object:
    """The vendored code around ``stock``, with a private loaded iteration."""
    state = {"get_loaded_iteration": lambda: iteration, "print_rank_0": lambda *a: None}
    function = with_globals(vendored, {**state, NAME: with_globals(stock, state)})
    try:
        return function("/nowhere", _args())
    except SystemExit as exc:
        return ("exit", exc.code)


def test_another_exit_of_the_installed_function_passes_through():
    """A checkpoint that cannot be read also ends in ``sys.exit()`` (iteration found):
    the pull request leaves that one alone, and so does the translation."""

    def unreadable_checkpoint(*args):
        sys.exit()

    assert _run_vendored_over(unreadable_checkpoint, 5) == ("exit", None)
    assert _run_vendored_over(unreadable_checkpoint, -1) == ("exit", 1)


def test_a_returned_checkpoint_passes_through_unchanged():
    loaded = ({"iteration": 5}, "ckpt", False, "legacy")
    assert _run_vendored_over(lambda *args: loaded, 5) is loaded


# --- megatron's own function: before apply, after it, after revert --------------------------


def test_real_function_exits_0_then_1_with_the_backport_then_0_after_revert(
    checkpointing, installed, tmp_path
):
    assert _exit_status(checkpointing._load_base_checkpoint, tmp_path) == 0
    report = report_for(apply(only=ID), ID)
    try:
        assert (report.verdict, report.action) == (Verdict.NEEDED, Action.INSTALLED)
        assert checkpointing._load_base_checkpoint.__backport__ == ID
        assert _exit_status(checkpointing._load_base_checkpoint, tmp_path) == 1
        # Without the flag the job goes on from random weights, as before.
        assert _exit_status(checkpointing._load_base_checkpoint, tmp_path, flag=False) == (
            None,
            "",
            False,
            None,
        )
    finally:
        report_for(revert(only=ID), ID)
    assert vars(checkpointing)[NAME] is installed
    assert _exit_status(checkpointing._load_base_checkpoint, tmp_path) == 0


def test_real_load_args_from_checkpoint_exits_1_through_the_backport(checkpointing, tmp_path):
    """megatron's ``load_args_from_checkpoint`` (a caller in the same module, by name)
    reaches the translation: status 1 with it, 0 without."""

    def load_args(load_dir: str, args: SimpleNamespace) -> object:
        args.load = load_dir
        return checkpointing.load_args_from_checkpoint(args)

    assert _exit_status(load_args, tmp_path) == 0
    apply(only=ID)
    try:
        assert _exit_status(load_args, tmp_path) == 1
    finally:
        revert(only=ID)
    assert _exit_status(load_args, tmp_path) == 0


# --- status ----------------------------------------------------------------------------------


def test_status_on_0_19_2_says_needed_with_its_reason():
    report = report_for(status(only=ID), ID)
    assert report.verdict is Verdict.NEEDED
    assert "status 0" in report.reason
    assert report.evidence["target"]["module"] == MODULE


_FIXED_SOURCE = '''
def _load_base_checkpoint(
    load_dir,
    args,
    rank0=False,
    sharded_state_dict=None,
    checkpointing_context=None,
    dp_cp_group=None,
    expt_dp_group=None,
    gpt_compat_layer_maps=None,
):
    """Behaves like megatron after #6321 for a load directory without a checkpoint."""
    if os.path.isfile(get_checkpoint_tracker_filename(load_dir)):
        raise NotImplementedError("a made-up variant: only the missing checkpoint")
    set_loaded_iteration(-1)
    if args.exit_on_missing_checkpoint:
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
        sys.exit(1)
    return None, "", False, None
'''


def _fixed_variant(module: types.ModuleType) -> types.FunctionType:
    """A function of ``module`` (compiled under its file name, its globals) that has the
    fix: what a megatron-core with #6321 merged holds."""
    scratch: dict[str, Any] = {}
    exec(compile(_FIXED_SOURCE, module.__file__, "exec"), scratch)
    code = scratch[NAME].__code__
    function = types.FunctionType(code, vars(module), NAME, scratch[NAME].__defaults__)
    function.__module__ = module.__name__
    return function


def test_status_on_a_release_with_the_fix_says_upstream(checkpointing, monkeypatch):
    monkeypatch.setattr(checkpointing, NAME, _fixed_variant(checkpointing))
    # The sniff alone is not enough: with no recorded text, git or release it is "drifted".
    drifted = report_for(status(only=ID), ID)
    assert drifted.verdict is Verdict.INCOMPATIBLE and "drifted" in drifted.reason
    recorded_as_carrying_the_fix(monkeypatch, ID)
    report = report_for(status(only=ID), ID)
    assert report.verdict is Verdict.UPSTREAM, report.reason
    assert report.action is Action.WOULD_SKIP
    assert "vendor/megatron_lm_6321" in report.reason


# The contract kit runs for every entry in tests/catalog/test_contract.py (its reload check
# in the slow selection); what follows is specific to this fix.


# --- megatron.training's logging set-up stays off a command's stdout --------------------------


def test_root_logging_set_up_at_import_stays_off_the_commands_stdout(monkeypatch, capsys):
    """Importing megatron.training runs ``logging.basicConfig`` (a stdout handler at INFO);
    during a command the tool's INFO records must not land in its table or JSON."""
    import logging

    from backports.megatron.commands.output import root_logging_kept_off_stdout

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # as in a fresh `backports` process
    monkeypatch.setattr(root, "level", logging.WARNING)
    with root_logging_kept_off_stdout():
        logging.basicConfig(handlers=[logging.StreamHandler(sys.stdout)], level=logging.INFO)
        logging.getLogger("backports.megatron.job.announce").info("installed %s", ID)
        logging.getLogger("backports.megatron.job.announce").warning("a warning")
    out, err = capsys.readouterr()
    assert out == ""
    assert "a warning" in err and "installed" not in err
    assert root.handlers == []


def test_check_json_on_stdout_is_json_alone(tmp_path):
    """`backports check --json` imports megatron.training (this entry's target) and installs
    it: its stdout is the JSON document and nothing else."""
    import json
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_BACKPORTS")}
    env["MEGATRON_BACKPORTS_CACHE"] = "0"
    command = [sys.executable, "-P", "-m", "backports.megatron", "check", "--only", ID, "--json"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = json.loads(done.stdout)
    assert row["id"] == ID and row["check"]["ok"] is True
