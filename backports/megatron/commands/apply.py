"""``backports apply``: apply the backports in this process and write the start-up hook, so
that every later interpreter of the environment applies them too."""

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

from .. import api, exit_status
from ..errors import BackportError
from . import _hook, _job, _options, output


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _options.add_report_formats(parser)
    _options.add_only(parser)
    _options.add_site_dir(parser)
    parser.add_argument("--strict", action="store_true", help="fail on incompatible, also later")


def run(args: argparse.Namespace) -> int:
    site_dir = _hook.site_dir(args)  # before any work: a mistyped folder is a usage error
    only = _options.only(args)
    # Imported first, the targets are probed once and installed now instead of deferred:
    # this table (apply's own reports) is the truth for this environment.
    api.load_targets(only)
    try:
        reports = api.apply(only, strict=args.strict)
    except BackportError as exc:
        if not args.strict:
            raise
        print(f"backports: {exc}; hook not written", file=sys.stderr)
        return exit_status.FAILED
    hook_notes, hook = _write_hook(args, site_dir)
    notes = hook_notes + _process_only_notes()
    reports = [replace(r, evidence={**r.evidence, "hook": hook.evidence(r.id)}) for r in reports]
    output.emit(args, reports, notes)
    return exit_status.DONE


def _hook_selection(only: tuple[str, ...] | None) -> tuple[bool, tuple[str, ...] | None, str]:
    """(write a hook?, its ``only``, why it differs from the command's selection).

    The switches this command runs under are meant for the environment too: the ids that
    ``MEGATRON_BACKPORTS_SKIP`` names are left out of the hook, and under
    ``MEGATRON_BACKPORTS=0`` (or a skip of every selected id) no hook is written.
    """
    if api.all_switched_off():
        return False, None, f"{api.ENV_ENABLE}={os.environ[api.ENV_ENABLE].strip()} is set"
    ids = api.selected_ids(only)
    skipped = api.skipped_by_environment()
    left_out = [i for i in ids if i in skipped]
    if not left_out:
        return True, only, ""
    kept = tuple(i for i in ids if i not in left_out)
    return bool(kept), kept, f"{api.ENV_SKIP} names {', '.join(left_out)}"


def _write_hook(args: argparse.Namespace, folder: Path) -> tuple[list[str], _hook.Hook]:
    """Write the hook as this command's arguments and switches ask: notes on what it did,
    and the hook as it now is (the files are read once)."""
    write, hook_only, why = _hook_selection(_options.only(args))
    if not write:
        hook = _hook.Hook.read(folder)
        note = f"hook: not written: every backport asked for is off ({why})"
        if hook.state.exists:
            note += (
                f"; {hook.state.path} from an earlier apply stays (`backports revert` removes it)"
            )
        return [note], hook
    state, changed = _job.write_hook(folder, hook_only, args.strict)
    # What write_hook wrote (or found equal) is the current text: no second read.
    hook = _hook.Hook(state, True, _job.is_site_dir(folder))
    notes = [f"hook: {'wrote' if changed else 'unchanged:'} {hook.files()}"]
    if why:
        notes.append(
            f"hook: leaves out what {why}: later processes do not apply it "
            "(to include it, rerun `backports apply` without the variable)"
        )
    return notes + _hook.site_warning(folder), hook


def _process_only_notes() -> list[str]:
    if not api.upstream_only_requested():
        return []
    value = os.environ[api.ENV_UPSTREAM_ONLY].strip()
    return [
        f"note: {api.ENV_UPSTREAM_ONLY}={value} holds for this process only: the hook does "
        "not record it; set it in the job's environment too"
    ]
