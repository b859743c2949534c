"""The last step of a sync: write the new pair into a staged copy and swap it in.

The vendored file and UPSTREAM.toml must change together: a new file with the old
manifest makes the probe refuse the backport wherever the tree ships. Both are written
into a copy of the folder beside it (``.<name>.sync-new-*``), which then takes the
folder's place in two renames: the folder to ``.<name>.sync-old``, the copy to the
folder. Ctrl-C is held for those two renames; an error in the second puts the folder
back; a killed run leaves ``.<name>.sync-old`` for ``recover_interrupted`` to put right.
"""

import contextlib
import difflib
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from .errors import WriteError

_STAGE_INFIX = ".sync-new-"
_OLD_SUFFIX = ".sync-old"


def unified_diff(old: str, new: str, name: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{name}", f"b/{name}"
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.exists() else ""


def write_file(path: Path, text: str) -> None:
    """Write ``text`` and flush it to disk (before the folder holding it is swapped in)."""
    with open(path, "wb") as handle:
        handle.write(text.encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())


def _set_aside(folder: Path) -> Path:
    return folder.with_name(f".{folder.name}{_OLD_SUFFIX}")


@contextlib.contextmanager
def staged_copy(folder: Path, beside: bool = True) -> Iterator[Path]:
    """A copy of ``folder`` to write into; removed on exit unless swapped in first.

    ``beside``: in the folder's parent, so the swap is a rename on one file system;
    otherwise (a dry run) under the system's temporary directory.
    """
    parent = folder.parent if beside else None
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}{_STAGE_INFIX}", dir=parent))
    except OSError as exc:
        raise WriteError(f"cannot stage the new files beside {folder}: {exc}") from exc
    try:
        stage = staging / folder.name
        try:
            shutil.copytree(folder, stage, ignore=shutil.ignore_patterns("__pycache__"))
        except OSError as exc:
            raise WriteError(f"cannot stage a copy of {folder}: {exc}") from exc
        yield stage
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _interrupts_held() -> Iterator[list[int]]:
    """Hold Ctrl-C (SIGINT) until the block is done; the list says whether one came."""
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held  # signal handlers can only be set in the main thread
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def swap_in(stage: Path, folder: Path) -> bool:
    """Put the staged copy in ``folder``'s place; True if Ctrl-C came meanwhile (held)."""
    aside = _set_aside(folder)
    with _interrupts_held() as held:
        try:
            os.rename(folder, aside)
        except OSError as exc:
            raise WriteError(f"cannot move {folder} aside: {exc}; nothing written") from exc
        try:
            os.rename(stage, folder)
        except BaseException as exc:
            _put_back(aside, folder, exc)
            if isinstance(exc, OSError):
                raise WriteError(f"cannot move the new files into {folder}: {exc}") from exc
            raise
        _fsync_dir(folder.parent)
        shutil.rmtree(aside, ignore_errors=True)
    return bool(held)


def _put_back(aside: Path, folder: Path, cause: BaseException) -> None:
    try:
        os.rename(aside, folder)
    except BaseException as exc:
        raise WriteError(
            f"{type(cause).__name__} while swapping in the new files, and the old folder "
            f"could not be put back ({exc}): it is {aside}; the next run puts it back"
        ) from exc


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def leftovers(vendor: Path) -> list[Path]:
    """Staged copies and set-aside folders a killed run left in ``vendor``."""
    return sorted(
        path
        for path in vendor.glob(".*")
        if path.is_dir() and (path.name.endswith(_OLD_SUFFIX) or _STAGE_INFIX in path.name)
    )


def recover_interrupted(vendor: Path) -> list[str]:
    """Undo or finish what a killed run left; one line per thing done."""
    done = []
    for path in leftovers(vendor):
        if _STAGE_INFIX in path.name:
            shutil.rmtree(path)
            done.append(f"removed {path.name}, a staged copy a killed sync left")
            continue
        folder = vendor / path.name[1:].removesuffix(_OLD_SUFFIX)
        if folder.exists():
            shutil.rmtree(path)
            done.append(f"removed {path.name}: the sync that set it aside had finished")
        else:
            os.rename(path, folder)
            done.append(f"put {folder.name}/ back from {path.name}: its sync was killed")
    return done
