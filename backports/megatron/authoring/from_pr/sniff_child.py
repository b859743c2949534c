"""The child interpreter's side of step five: synthesise the sniff by running the code.

Run as ``python -I`` in a private scratch folder (``child.run_child``): it imports the
installed megatron-core and the staged vendored module (the pull request's code), and for
each target tries the routes in order, keeping the first that tells the installed code
from the fixed one:

(a) the pull request's own test, run on the target (bound as the test names it) when it
    runs here on CPU within seconds: it must fail on the installed code and pass on the
    fixed code;
(b) the test's observation lifted onto stand-ins (``explore.search`` with the names the
    test observes as its focus);
(c) a differential search over inputs (``explore.search``, any difference); where it finds
    nothing, once more with the target's callees recorded (``explore.callee_recorders``).

Soundness before speed: a candidate sniff of any route is kept only if it calls every
semantics-preserving rewrite of the installed code (``rewrites``) *needed* and every
rewrite of the fixed code *fixed*; one that does not judges how the code is written, not
what it does, and is discarded (the search goes on). The answer says how many rewrites the
kept sniff passed and how many candidates they discarded.

Reads a JSON request file, writes a JSON answer file.
"""

import importlib
import inspect
import json
import sys
import time
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, cast

from .standin import Function

if TYPE_CHECKING:
    from .standin import Observation

# The request and answer files are JSON written by ``child.run_child`` and read back there.
Json = dict[str, Any]


class _Test(TypedDict):
    """One test of the pull request, as the request carries it."""

    id: str
    source: str
    function: str
    names: list[str]


class _Target(TypedDict):
    module: str
    attribute: str
    replacement: str


class _Request(TypedDict):
    vendored: str
    main_module: str
    targets: list[_Target]
    focus: list[str]
    max_runs: int
    search_seconds: float
    test_seconds: float
    tests: NotRequired[list[_Test]]


def _unwrapped(obj: object) -> Function:
    """The function a class dict entry stands for: a static method's, a property's getter."""
    if isinstance(obj, property):
        obj = obj.fget
    elif isinstance(obj, staticmethod):
        obj = obj.__func__
    return cast(Function, inspect.unwrap(cast(Callable[..., object], obj)))


class Unavailable(RuntimeError):
    """The installed target cannot be reached here (its one-line reason is the message)."""


def _has_transformer_engine() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("transformer_engine") is not None
    except (ImportError, ValueError):
        return False


def _why_missing(module: types.ModuleType, owner_name: str, attribute: str) -> str:
    """One line: why ``attribute`` is not there to run (a class that exists only with
    Transformer Engine, where it is not installed, says so)."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        source = ""
    if "transformer_engine" in source and not _has_transformer_engine():
        return (
            f"{attribute}: {owner_name} exists only with Transformer Engine, which is not "
            "installed here: no route can run it (derive where Transformer Engine is "
            "installed, or write the sniff by hand)"
        )
    return f"{attribute}: {module.__name__} defines no such function here"


def _installed(module_name: str, attribute: str) -> tuple[Function, types.ModuleType]:
    """(the installed undecorated function, a property's getter, its module);
    ``Unavailable`` where the module does not define it (a class that exists only with
    Transformer Engine, say)."""
    module = importlib.import_module(module_name)
    owner_name, _, name = attribute.rpartition(".")
    owner = getattr(module, owner_name, None) if owner_name else module
    found = vars(owner).get(name) if isinstance(owner, type | types.ModuleType) else None
    if isinstance(found, property) and found.fget is not None:
        found = found.fget  # a property's getter: what the routes run, with ``self``
    if not callable(found) and not isinstance(found, staticmethod | classmethod):
        raise Unavailable(_why_missing(module, owner_name or module_name, attribute))
    return _unwrapped(found), module


@dataclass
class _Soundness:
    """The rewrites of both versions a candidate sniff must judge as their originals."""

    installed: list[tuple[str, Function]]
    fixed: list[tuple[str, Function]]
    discarded: int = 0
    why: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, installed: Function, fixed: Function) -> "_Soundness":
        from .rewrites import rewrites

        return cls(rewrites(installed), rewrites(fixed))

    def _cases(self) -> list[tuple[str, Function, bool]]:
        return [(f"the installed code ({name})", f, False) for name, f in self.installed] + [
            (f"the fixed code ({name})", f, True) for name, f in self.fixed
        ]

    def refute(self, says: Callable[[Function], bool | str]) -> str | None:
        """Why a candidate cannot be kept (``says`` a rewrite's verdict: fixed, or a text
        saying it could not tell), or None where every rewrite reads as its version."""
        for shown, function, fixed in self._cases():
            verdict = says(function)
            if verdict is not fixed:
                said = verdict if isinstance(verdict, str) else ("fixed" if verdict else "needed")
                return f"{shown} rewritten reads {said}"
        return None

    def discard(self, why: str) -> None:
        """Count a discarded candidate sniff (the first few reasons are kept)."""
        self.discarded += 1
        if len(self.why) < 3:
            self.why.append(why)

    def observation(self, observation: "Observation") -> str | None:
        from ._tool import with_globals
        from .standin import Mismatch, judge, seen

        def says(function: Function) -> bool | str:
            try:
                return judge(seen(function, observation, with_globals), observation)
            except Mismatch as exc:
                return f"neither ({exc})"

        return self.refute(says)

    def answer(self) -> Json:
        return {
            "passed": len(self.installed) + len(self.fixed),
            "installed": [name for name, _ in self.installed],
            "fixed": [name for name, _ in self.fixed],
            "discarded": self.discarded,
            "why": self.why,
        }


def _test_says(test: _Test, module: str, attribute: str) -> Callable[[Function], bool | str]:
    """A version's verdict by the test: fixed (passed), needed (failed), else its error."""
    from .standin import is_failure, run_upstream_test

    def says(version: Function) -> bool | str:
        code = _unwrapped(version).__code__
        outcome = run_upstream_test(
            test["source"], test["function"], module, attribute, version, inside=code
        )
        return outcome == "passed" if outcome == "passed" or is_failure(outcome) else outcome

    return says


def _route_a(
    request: _Request,
    target: _Target,
    installed: Function,
    fixed: Function,
    soundness: _Soundness,
) -> Json | None:
    """The first of the pull request's tests that fails on the installed code and passes
    on the fixed code (and reads every rewrite as its version); None where no test
    reaches the target."""
    from .standin import is_failure, run_upstream_test

    tried = []
    module, attribute = target["module"], target["attribute"]
    for test in request.get("tests", []):
        start = time.monotonic()
        stock = run_upstream_test(
            test["source"], test["function"], module, attribute, installed, installed.__code__
        )
        if stock.startswith("error: the test reaches nothing"):
            continue
        if "does not load here" in stock:
            tried.append(f"a: {test['id']} {stock.partition(': ')[2]}")
            continue
        ours = run_upstream_test(test["source"], test["function"], module, attribute, fixed)
        seconds = round(time.monotonic() - start, 2)
        tried.append(
            f"a: {test['id']}: {stock} on the installed code, {ours} on the fixed ({seconds} s)"
        )
        if not is_failure(stock) or ours != "passed" or seconds >= request["test_seconds"]:
            continue
        why = soundness.refute(_test_says(test, module, attribute))
        if why is None:
            return {"route": "a", "test": test, "seconds": seconds, "tried": tried}
        soundness.discard(why)
        tried.append(f"a: {test['id']} discarded: {why}")
    return {"route": None, "tried": tried} if tried else None


# Why route a had nothing to run: no test could run as a sniff here, or none reaches it.
_NO_TEST = (
    "no test of the pull request reaches the target and runs as a sniff (a module-level "
    "test or one of a plain test class, no fixtures, literal parameters at most)"
)


def _route_bc(
    request: _Request,
    target: _Target,
    installed: Function,
    fixed: Function,
    module: types.ModuleType,
    soundness: _Soundness,
) -> Json:
    from ._tool import with_globals
    from .explore import callee_recorders, recorders_for, search

    recorders = recorders_for([installed, fixed], vars(module))
    callees = callee_recorders([installed, fixed], vars(module))
    tried = []
    passes = [("b", frozenset(request["focus"]), recorders), ("c", frozenset(), recorders)]
    if callees != recorders:  # the last try: what the target hands every callee
        passes.append(("c", frozenset(), callees))
    for route, focus, recorded in passes:
        if route == "b" and not focus:
            tried.append("b: the pull request's tests observe no name its change touches")
            continue
        found = search(
            installed,
            fixed,
            target=target["attribute"],
            module=target["module"],
            recorders=recorded,
            with_globals=with_globals,
            focus=focus,
            max_runs=request["max_runs"],
            seconds=request["search_seconds"],
            validate=soundness.observation,
            on_discard=soundness.discard,
        )
        if found is not None:
            from dataclasses import asdict

            return {
                "route": route,
                "observation": asdict(found.observation),
                "runs": found.runs,
                "seconds": round(found.seconds, 2),
                "attributes": found.attributes,
                "clean": found.clean,
                "tried": tried,
            }
        shown = route if recorded is recorders else f"{route}, callees recorded too"
        tried.append(f"{shown}: no input within the budget told the versions apart")
    return {"route": None, "tried": tried, "recorders": list(callees)}


def _one(request: _Request, target: _Target, vendored: types.ModuleType) -> Json:
    installed, module = _installed(target["module"], target["attribute"])
    fixed = getattr(vendored, target["replacement"])
    soundness = _Soundness.of(installed, _unwrapped(fixed))
    answer = None
    if request.get("tests"):
        answer = _route_a(request, target, installed, fixed, soundness)
    if answer is not None and answer["route"] == "a":
        return {**answer, "rewrites": soundness.answer()}
    tried = answer["tried"] if answer else [f"a: {_NO_TEST}"]
    result = _route_bc(request, target, installed, fixed, module, soundness)
    result["tried"] = tried + result["tried"]
    result["rewrites"] = soundness.answer()
    return result


def target_answer(request: _Request, target: _Target, vendored: types.ModuleType) -> Json:
    """One target's answer; what stopped its routes is its one line."""
    try:
        return _one(request, target, vendored)
    except KeyboardInterrupt:
        raise
    except Unavailable as exc:
        return {"route": None, "tried": [str(exc)]}
    except BaseException as exc:  # the pull request's code ends no answer
        return {
            "route": None,
            "tried": [f"the search failed: {type(exc).__name__}: {exc}"],
            "traceback": traceback.format_exc(limit=-4),
        }


def main(argv: list[str]) -> int:
    with open(argv[0], encoding="utf-8") as handle:
        request = json.load(handle)
    answer: Json = {"targets": {}}
    try:
        vendored = importlib.import_module(request["vendored"])
        vendored.__target_module__ = request["main_module"]  # type: ignore[attr-defined]
        for target in request["targets"]:
            answer["targets"][target["attribute"]] = target_answer(request, target, vendored)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit or pytest's outcomes from an import too
        answer["error"] = f"{type(exc).__name__}: {exc}"
        answer["traceback"] = traceback.format_exc(limit=-4)
    with open(argv[1], "w", encoding="utf-8") as handle:
        json.dump(answer, handle, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
