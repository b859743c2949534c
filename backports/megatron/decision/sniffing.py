"""Running an entry's sniff: on the installed code, and on what the applier would install.

The sniff is the entry's own code (a plugin's, perhaps): it runs bounded and contained.
``run_sniff`` gives it a thread of its own and a time limit (a sniff that does not return
is judged ``incompatible``, "sniff timed out after N s", while the job goes on), and puts
back what it may have changed in the process: the working directory, ``sys.path``,
``sys.meta_path``, the environment, and the ``random`` / numpy / torch generators.

On the vendored code the sniff runs on stand-ins: each live resolved target with the
replacement where the original stands (``Kind.stand_in``), undecorated. In the default mode
the first target's replacement is the vendored function wrapped in the entry's local changes.
Sniffs give the function they call private globals (``private_globals.with_globals``: a
recording kernel in place of the real one); a copy of the outer local-change wrapper would
not pass those on to the vendored function it closes over. So the stand-in is a small
trampoline: a private copy of it carries the sniff's globals, and each call wraps a copy of
the vendored function given those globals in the local changes, then calls that.
"""

import ast
import builtins
import contextlib
import importlib
import inspect
import os
import random
import sys
import textwrap
import threading
import time
import types
from collections.abc import Callable, Iterator, Sequence
from typing import cast

from ..kinds import Resolved, kind_of
from ..local_changes import wrap_all
from ..model import BackportSpec, SniffFailed, SniffResult
from ..private_globals import with_globals

# Bounds on one sniff, in seconds: in this process (milliseconds as a rule), and one that
# starts child interpreters (each imports torch and megatron: tens of seconds on a busy
# machine). MEGATRON_BACKPORTS_SNIFF_TIMEOUT overrides both.
IN_PROCESS_LIMIT_S = 60.0
IN_CHILD_LIMIT_S = 600.0
TIMEOUT = "MEGATRON_BACKPORTS_SNIFF_TIMEOUT"


def folder_name(spec: BackportSpec) -> str:
    """``vendor/<folder>``, as a person finds the entry's vendored code."""
    return f"vendor/{spec.vendored.package.rpartition('.')[2]}"


def sniff_time_limit(in_child: bool) -> float:
    raw = os.environ.get(TIMEOUT, "").strip()
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value > 0:
        return value
    return IN_CHILD_LIMIT_S if in_child else IN_PROCESS_LIMIT_S


@contextlib.contextmanager
def _process_state_kept() -> Iterator[None]:
    """Put back what a sniff may change in the process: cwd, ``sys.path``,
    ``sys.meta_path``, the environment (only the keys it changed), the generators."""
    cwd = os.getcwd()
    path, meta_path = list(sys.path), list(sys.meta_path)
    environ = dict(os.environ)
    generators = _generator_states()
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.chdir(cwd)
        if sys.path != path:
            sys.path[:] = path
        if sys.meta_path != meta_path:
            sys.meta_path[:] = meta_path
        _put_back_environ(environ)
        _set_generator_states(generators)


def _put_back_environ(before: dict[str, str]) -> None:
    now = dict(os.environ)
    for name in now.keys() - before.keys():
        os.environ.pop(name, None)
    for name, value in before.items():
        if now.get(name) != value:
            os.environ[name] = value


def _generator_states() -> dict[str, object]:
    """The states of the random generators a training job seeds (numpy and torch only if
    the process imported them: nothing is imported here)."""
    states: dict[str, object] = {"random": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states["numpy"] = numpy.random.get_state()
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_rng_state"):
        states["torch"] = torch.get_rng_state()
    return states


def _set_generator_states(states: dict[str, object]) -> None:
    random.setstate(cast(tuple[object, ...], states["random"]))  # ``random.getstate()``'s
    if "numpy" in states:
        sys.modules["numpy"].random.set_state(states["numpy"])
    if "torch" in states:
        sys.modules["torch"].set_rng_state(states["torch"])


_THIS_THREAD = threading.local()


@contextlib.contextmanager
def sniffs_in_this_thread() -> Iterator[None]:
    """Sniffs run in the calling thread, one after another, with no time limit, while this
    is entered: for decisions made inside an import (the deferred path). That thread holds
    the module's import lock, and a sniff thread that imports the module (a vendored
    module's ``__getattr__`` does) would wait on it forever."""
    before = getattr(_THIS_THREAD, "inline", False)
    _THIS_THREAD.inline = True
    try:
        yield
    finally:
        _THIS_THREAD.inline = before


def run_sniffs(
    spec: BackportSpec, target_sets: Sequence[Sequence[Resolved]], *, in_child: bool
) -> list[SniffResult | BaseException]:
    """``spec.sniff(targets)`` for each set of targets, each in a thread of its own, side by
    side (a sniff that starts child interpreters waits on them), within the time limit, with
    the process state put back afterwards (in this thread, with no limit, inside
    ``sniffs_in_this_thread``). Per set: the ``SniffResult``, or what the sniff raised
    (``SniffFailed`` when it timed out, ``TypeError`` for a result of another type)."""
    limit = sniff_time_limit(in_child)
    outcomes: list[list[object]] = [[] for _ in target_sets]
    _import_before_the_clock(spec.sniff_imports)

    def sniff(targets: Sequence[Resolved], outcome: list[object]) -> None:
        try:
            outcome.append(spec.sniff(targets))
        except KeyboardInterrupt as exc:  # the user's Ctrl-C reaches the main thread only
            if threading.current_thread() is threading.main_thread():
                raise
            outcome.append(exc)
        except BaseException as exc:
            outcome.append(exc)

    if getattr(_THIS_THREAD, "inline", False):
        with _process_state_kept():
            for targets, outcome in zip(target_sets, outcomes, strict=True):
                sniff(targets, outcome)
        return [_outcome(outcome, limit) for outcome in outcomes]
    with _process_state_kept():
        threads = [
            threading.Thread(
                target=sniff,
                args=(targets, outcome),
                name=f"backports-sniff-{spec.id}",
                daemon=True,
            )
            for targets, outcome in zip(target_sets, outcomes, strict=True)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + limit  # the threads run side by side: one limit for all
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
    return [_outcome(outcome, limit) for outcome in outcomes]


def _import_before_the_clock(modules: Sequence[str]) -> None:
    """``spec.sniff_imports``, outside the time limit. One that fails to import is left to
    the sniff, which meets the same error inside its bounds and reports it."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # reported by the sniff that needs it
            continue


def _outcome(outcome: list[object], limit: float) -> SniffResult | BaseException:
    if not outcome:
        return SniffFailed(f"sniff timed out after {limit:g} s")
    result = outcome[0]
    if isinstance(result, SniffResult | BaseException):
        return result
    return TypeError(f"the sniff returned {type(result).__name__}, not a SniffResult")


def run_sniff(spec: BackportSpec, targets: Sequence[Resolved], *, in_child: bool) -> SniffResult:
    """``run_sniffs`` for one set of targets; raises what the sniff raised."""
    (result,) = run_sniffs(spec, [targets], in_child=in_child)
    if isinstance(result, BaseException):
        raise result
    return result


def stub_of(functions: Sequence[object]) -> str | None:
    """The qualified name of the first replacement whose body (past a docstring) is one
    ``raise NotImplementedError``, as ``backports new`` leaves it; None when there is none."""
    for function in functions:
        if _is_stub(function):
            return str(getattr(function, "__qualname__", repr(function)))
    return None


def _is_stub(function: object) -> bool:
    code = getattr(function, "__code__", None)
    if code is None or "NotImplementedError" not in code.co_names:
        return False  # the common case, decided without reading the source
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cast(types.FunctionType, function))))
    except (OSError, TypeError, SyntaxError):
        return False
    definition = tree.body[0] if tree.body else None
    if not isinstance(definition, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    body = definition.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    if len(body) != 1 or not isinstance(body[0], ast.Raise):
        return False
    raised = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(raised, ast.Name) and raised.id == "NotImplementedError"


def stand_ins(
    spec: BackportSpec, targets: Sequence[Resolved], replacements: Sequence[object], composed: bool
) -> list[Resolved]:
    """Each live target with what the applier makes in its place (``replacements``: the
    vendored objects alone, in catalog order); ``composed``: the first in the local changes."""
    shown = list(replacements)
    if composed and spec.local_changes:
        shown[0] = sniffable(
            cast(Callable[..., object], shown[0]), spec
        )  # local changes wrap a function
    return [
        kind_of(target).stand_in(target, resolved, replacement)
        for target, resolved, replacement in zip(spec.targets, targets, shown, strict=True)
    ]


def _trampoline(*args: object, **kwargs: object) -> object:
    # Runs with the globals ``sniffable`` gives it (or a sniff's private copy of them):
    # ``_call`` is defined there, never in this module.
    return _call(globals(), args, kwargs)  # type: ignore[name-defined]  # noqa: F821


def sniffable(vendored: Callable[..., object], spec: BackportSpec) -> types.FunctionType:
    """The vendored function in the local changes, as a function whose private globals (a
    sniff's ``with_globals``) reach the vendored function inside."""
    composed = wrap_all(vendored, spec.local_changes)  # built once here: it must build
    own: dict[str, object] = {"__builtins__": builtins}

    def call(
        namespace: dict[str, object], args: tuple[object, ...], kwargs: dict[str, object]
    ) -> object:
        overrides = {name: value for name, value in namespace.items() if name not in own}
        inner = with_globals(vendored, overrides) if overrides else vendored
        return wrap_all(inner, spec.local_changes)(*args, **kwargs)

    own["_call"] = call
    stand_in = types.FunctionType(_trampoline.__code__, own, getattr(composed, "__name__", None))
    stand_in.__qualname__ = getattr(composed, "__qualname__", stand_in.__name__)
    stand_in.__doc__ = getattr(composed, "__doc__", None)
    # A callable without a signature leaves the trampoline's (*args, **kwargs).
    with contextlib.suppress(TypeError, ValueError):
        stand_in.__signature__ = inspect.signature(composed)  # type: ignore[attr-defined]
    return stand_in
