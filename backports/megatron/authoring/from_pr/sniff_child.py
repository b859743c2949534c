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
(c) a differential search over inputs (``explore.search``, any difference).

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
from typing import Any, NotRequired, TypedDict, cast

from .standin import Function

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


def _unwrapped(obj: Callable[..., object]) -> Function:
    return cast(Function, inspect.unwrap(obj.__func__ if isinstance(obj, staticmethod) else obj))


def _installed(module_name: str, attribute: str) -> tuple[Function, types.ModuleType]:
    """(the installed undecorated function, its module)."""
    module = importlib.import_module(module_name)
    owner_name, _, name = attribute.rpartition(".")
    owner = getattr(module, owner_name) if owner_name else module
    return _unwrapped(vars(owner)[name]), module


def _test(test: _Test) -> Function:
    namespace: dict[str, object] = {"__name__": "_backports_upstream_test"}
    exec(compile(test["source"], "<upstream test>", "exec"), namespace)
    return cast(Function, namespace[test["function"]])


def _route_a(
    request: _Request, target: _Target, installed: Function, fixed: Function
) -> Json | None:
    from ._tool import with_globals
    from .standin import run_test, test_binding

    tried = []
    for test in request.get("tests", []):
        name = target["attribute"].rpartition(".")[0] or target["attribute"]
        if name not in test["names"]:
            continue
        start = time.monotonic()
        try:
            function = _test(test)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # its imports need the test tree, a GPU, ... (or skip)
            tried.append(f"a: {test['id']} does not load here: {type(exc).__name__}: {exc}")
            continue
        module, attribute = target["module"], target["attribute"]
        stock = run_test(function, *test_binding(module, attribute, installed), with_globals)
        ours = run_test(function, *test_binding(module, attribute, fixed), with_globals)
        seconds = round(time.monotonic() - start, 2)
        tried.append(
            f"a: {test['id']}: {stock} on the installed code, {ours} on the fixed ({seconds} s)"
        )
        if stock == "failed" and ours == "passed" and seconds < request["test_seconds"]:
            return {"route": "a", "test": test, "seconds": seconds, "tried": tried}
    return {"route": None, "tried": tried} if tried else None


def _route_bc(
    request: _Request,
    target: _Target,
    installed: Function,
    fixed: Function,
    module: types.ModuleType,
) -> Json:
    from ._tool import with_globals
    from .explore import recorders_for, search

    recorders = recorders_for([installed, fixed], vars(module))
    tried = []
    for route, focus in (("b", frozenset(request["focus"])), ("c", frozenset())):
        if route == "b" and not focus:
            tried.append("b: the pull request's tests observe no name its change touches")
            continue
        found = search(
            installed,
            fixed,
            target=target["attribute"],
            module=target["module"],
            recorders=recorders,
            with_globals=with_globals,
            focus=focus,
            max_runs=request["max_runs"],
            seconds=request["search_seconds"],
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
        tried.append(f"{route}: no input within the budget told the versions apart")
    return {"route": None, "tried": tried, "recorders": list(recorders)}


def _one(request: _Request, target: _Target, vendored: types.ModuleType) -> Json:
    installed, module = _installed(target["module"], target["attribute"])
    fixed = getattr(vendored, target["replacement"])
    answer = _route_a(request, target, installed, fixed) if request.get("tests") else None
    if answer is not None and answer["route"] == "a":
        return answer
    tried = answer["tried"] if answer else ["a: no test of the pull request names the target"]
    result = _route_bc(request, target, installed, fixed, module)
    result["tried"] = tried + result["tried"]
    return result


def main(argv: list[str]) -> int:
    with open(argv[0], encoding="utf-8") as handle:
        request = json.load(handle)
    answer: Json = {"targets": {}}
    try:
        vendored = importlib.import_module(request["vendored"])
        vendored.__target_module__ = request["main_module"]  # type: ignore[attr-defined]
        for target in request["targets"]:
            try:
                answer["targets"][target["attribute"]] = _one(request, target, vendored)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # the pull request's code ends no answer
                answer["targets"][target["attribute"]] = {
                    "route": None,
                    "tried": [f"the search failed: {type(exc).__name__}: {exc}"],
                    "traceback": traceback.format_exc(limit=-4),
                }
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
