"""Find an input on which the installed and the fixed function do different things.

Both functions are called on the same stand-ins (``standin``), starting from the plainest
input (every ``bool()`` False, every argument a stand-in or its default); each input's
neighbours flip one answer a stand-in gave (a ``bool()``, an empty iteration, an attribute
a read with a default found absent: ``getattr(cfg, "x", False)``, ``hasattr``), or one
argument (None, its default), breadth first, within a budget of runs and seconds. The
first input where the facts differ is kept (one where both versions return is preferred),
with a control input on which both versions agree, as close to it as found.

With ``focus`` (route b: names the pull request's own test observes), only facts that
mention one of those names count as a difference: the test's observation, lifted onto the
stand-ins. Without it (route c), any difference counts.

With ``validate`` (``sniff_child``: the rewrites of both versions), a candidate is frozen
and kept only if the check holds; else the search goes on to the next one.

Runs in a child interpreter: the fixed function is the pull request's code.
"""

import inspect
import re
import sys
import time
import types
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from .standin import (
    HANDED_A_STAND_IN,
    LOCAL_IMPORTS,
    NUMBERS,
    Function,
    Observation,
    Run,
    Setting,
    WithGlobals,
    observe,
    present,
)

# What a callee's source says when it allocates on a GPU or talks to a process group.
_DEVICE_OR_GROUP = re.compile(
    r"\bcuda\b|torch\.distributed|\bdist\.|process_group|_group\b|all_reduce|all_gather|"
    r"reduce_scatter|broadcast\(|get_rank|get_world_size|current_device|transformer_engine|"
    r"\bte_\w+"
)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Found:
    observation: Observation
    runs: int
    seconds: float
    attributes: int  # the stand-ins' attributes the discovery loop added
    clean: bool  # both versions returned on the main input


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _names(const)
    return names


def _touches_device_or_groups(
    function: Function, namespace: Mapping[str, object], depth: int
) -> bool:
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return False
    if _DEVICE_OR_GROUP.search(source):
        return True
    if depth <= 0 or not hasattr(function, "__code__"):
        return False
    callees = [namespace.get(n) for n in _names(function.__code__)]
    return any(
        inspect.isfunction(c) and _touches_device_or_groups(c, c.__globals__, depth - 1)
        for c in callees
    )


def recorders_for(functions: list[Function], namespace: Mapping[str, object]) -> tuple[str, ...]:
    """Module globals the functions call that are megatron functions touching a GPU or a
    process group (their source says so, or that of a function they call), or compiled
    kernels (``torch.compile``, ``jit_fuser``): recorders stand in for them."""
    names: set[str] = set()
    for function in functions:
        names |= _names(function.__code__)
        own = function.__globals__
        names |= {n for n in own if inspect.isfunction(own[n]) and n in _names(function.__code__)}
    found = []
    for name in sorted(names):
        value = namespace.get(name, functions[-1].__globals__.get(name))
        megatron = getattr(value, "__module__", "") or ""
        is_ours = megatron.startswith("megatron") or "_vendor" in megatron or "vendor." in megatron
        compiled = getattr(value, "_torchdynamo_orig_callable", None)
        if compiled is not None and is_ours:
            found.append(name)  # a torch.compile'd kernel: compiling it on stand-ins fails
        elif (
            inspect.isfunction(value)
            and is_ours
            and _touches_device_or_groups(value, value.__globals__, depth=2)
        ):
            found.append(name)
    return tuple(found)


# Submodules of a module global (``torch``) that reach a GPU or a process group.
_DEVICE_OR_GROUP_MODULES = ("distributed", "cuda")


def _module_recorders(name: str, value: types.ModuleType) -> list[str]:
    """``torch.distributed`` itself (``import torch.distributed as dist``) is recorded
    whole; of ``torch``, its ``distributed`` and ``cuda`` (``torch.distributed.all_reduce``
    is then a call with what it was handed), and a function handed a stand-in, which no
    real one takes (``torch.*``); the rest of the module, and a standard one, stay real."""
    if value.__name__.split(".")[-1] in _DEVICE_OR_GROUP_MODULES:
        return [name]
    if value.__name__.split(".")[0] in sys.stdlib_module_names:
        return []
    # A library module's functions run for real unless handed a stand-in (``torch.*``).
    return [f"{name}.{HANDED_A_STAND_IN}"] + [
        f"{name}.{sub}"
        for sub in _DEVICE_OR_GROUP_MODULES
        if isinstance(getattr(value, sub, None), types.ModuleType)
    ]


def _is_library_callee(value: object) -> bool:
    """A function or class outside the standard library and Python's own: what the target
    hands it is what it does. Exception classes stay real (``except`` needs them)."""
    if not callable(value) or isinstance(value, types.ModuleType):
        return False
    if isinstance(value, type) and issubclass(value, BaseException):
        return False
    home = (getattr(value, "__module__", None) or "").split(".")[0]
    return bool(home) and home not in sys.stdlib_module_names and home != "builtins"


def callee_recorders(functions: list[Function], namespace: Mapping[str, object]) -> tuple[str, ...]:
    """Route c's last try: besides ``recorders_for``'s, every module global the functions
    call that is a megatron or a library function or class (``AutoTokenizer``), and the
    process-group and device submodules of a module they read (``torch.distributed``):
    the target's behaviour is then what it hands its callees, on every path, a GPU's or a
    process group's included. A helper the vendored module defines itself (one the pull
    request carries) stays its code: recording it would hide the fix."""
    fixed = functions[-1]
    names: set[str] = set()
    for function in functions:
        names |= _names(function.__code__)
    found = set(recorders_for(functions, namespace))
    if any(name.startswith("megatron") for name in names):  # an import in the body
        found.add(LOCAL_IMPORTS)
    for name in sorted(names):
        value = namespace.get(name, fixed.__globals__.get(name))
        carried = getattr(fixed.__globals__.get(name), "__module__", None) == fixed.__module__
        if isinstance(value, types.ModuleType):
            found.update(_module_recorders(name, value))
        elif name in namespace and not carried and _is_library_callee(value):
            found.add(name)
    return tuple(sorted(found))


def _facts(run: Run) -> set[str]:
    return set(run.facts)


def _focused(facts: set[str], focus: frozenset[str]) -> set[str]:
    if not focus:
        return facts
    return {fact for fact in facts if set(_WORD.findall(fact)) & focus}


def _anchors(differing: set[str], both: set[str]) -> tuple[str, ...]:
    calls = {fact.split(" ")[0] + " " + fact.split(" ")[1] for fact in differing if " " in fact}
    return tuple(sorted(c for c in calls if c.startswith("call ") and c in both))


@dataclass
class _Explorer:
    installed: Function
    fixed: Function
    recorders: tuple[str, ...]
    module: str
    with_globals: WithGlobals
    focus: frozenset[str]
    attributes: set[str]
    learned: dict[str, int]
    runs: int = 0

    def run(self, function: Function, setting: Setting) -> Run:
        chosen = dict(setting.lengths)
        live = Setting(
            dict(setting.arguments),
            dict(setting.truths),
            {**self.learned, **chosen},
            self.attributes,
        )
        run = observe(function, live, self.recorders, self.module, self.with_globals)
        for path, length in live.lengths.items():
            if path not in chosen:
                self.learned[path] = length
        self.runs += 1
        return run

    def pair(self, setting: Setting) -> tuple[Run, Run]:
        return self.run(self.installed, setting), self.run(self.fixed, setting)

    def difference(self, a: Run, b: Run) -> tuple[set[str], set[str]]:
        fa, fb = _facts(a), _facts(b)
        return _focused(fb - fa, self.focus), _focused(fa - fb, self.focus)


def _neighbours(
    setting: Setting, runs: tuple[Run, Run], parameters: list[tuple[str, list[str]]]
) -> list[Setting]:
    out = []
    for path in dict.fromkeys(runs[0].asked + runs[1].asked):
        flipped = setting.copy()
        flipped.truths[path] = not setting.truths.get(path, False)
        out.append(flipped)
    for path in dict.fromkeys(runs[0].iterated + runs[1].iterated):
        if path not in setting.lengths and runs[0].setting.lengths.get(path, 0) == 0:
            longer = setting.copy()
            longer.lengths[path] = 1
            out.append(longer)
    for path in dict.fromkeys(runs[0].missed + runs[1].missed):
        if present(path) not in setting.truths:  # read with a default: try it there too
            there = setting.copy()
            there.truths[present(path)] = True
            out.append(there)
    for index, (name, choices) in enumerate(parameters):
        current = setting.arguments.get(name, "default" if "default" in choices else "stand-in")
        for choice in choices if index else []:  # self / ctx stays a stand-in
            if choice != current:
                other = setting.copy()
                other.arguments[name] = choice
                out.append(other)
    return out


def _choices(setting: Setting) -> set[tuple[str, str, object]]:
    return (
        {("truth", k, v) for k, v in setting.truths.items()}
        | {("argument", k, v) for k, v in setting.arguments.items()}
        | {("length", k, v) for k, v in setting.lengths.items()}
    )


def _distance(a: Setting, b: Setting) -> int:
    """How many choices two inputs differ in."""
    return len(_choices(a) ^ _choices(b))


def _parameters(function: Function) -> list[tuple[str, list[str]]]:
    """Each parameter's choices: a stand-in, None, its default where it has one, and where
    that default is a number, the numbers a stand-in cannot be (``float(norm_type)`` of a
    stand-in raises, so ``norm_type == inf`` is reached only by the number itself)."""
    found = []
    for name, p in inspect.signature(function).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        choices = ["stand-in", "none"]
        if p.default is not p.empty:
            choices.append("default")
            if isinstance(p.default, int | float) and not isinstance(p.default, bool):
                choices.extend(NUMBERS)
        found.append((name, choices))
    return found


# A check a candidate sniff must pass to be kept: None where it holds, else why not.
Validate = Callable[[Observation], str | None]
_FALLBACKS = 64  # candidates where the installed code raises, checked at the end
_CONTROLS = 8  # agreeing inputs tried as a candidate's control, nearest first
_CRASH_RUNS = 64  # runs past a kept candidate spent looking for a crash the fix removes


def search(
    installed: Function,
    fixed: Function,
    *,
    target: str,
    module: str,
    recorders: tuple[str, ...],
    with_globals: WithGlobals,
    focus: frozenset[str] = frozenset(),
    max_runs: int = 4000,
    seconds: float = 60.0,
    validate: Validate | None = None,
    on_discard: Callable[[str], None] | None = None,
) -> Found | None:
    """The first input (breadth first) on which ``installed`` and ``fixed`` differ whose
    frozen sniff ``validate`` keeps; past a discarded candidate the search goes on (its
    neighbours too). Where the installed code raises on an input the fixed code returns
    from (a crash the fix removes: the bug itself), that input is preferred to one where
    both return and only what they call differs (how the fix is written): once such a
    candidate is kept, the search looks ``_CRASH_RUNS`` runs further for a crash first."""
    start = time.monotonic()
    ex = _Explorer(installed, fixed, recorders, module, with_globals, focus, set(), {})
    parameters = _parameters(installed)
    queue: deque[Setting] = deque([Setting()])
    visited = {Setting().key()}
    agreeing: list[Setting] = []
    fallbacks: list[Setting] = []
    kept: Found | None = None
    runs = max_runs
    while queue and ex.runs < runs and time.monotonic() - start < seconds:
        setting = queue.popleft()
        a, b = ex.pair(setting)
        only_fixed, only_installed = ex.difference(a, b)
        returned = [run.outcome.startswith("return") for run in (a, b)]
        if (only_fixed or only_installed) and returned[1]:  # the fixed code must return
            if not returned[0]:  # the installed code raises: the bug may be that
                fallbacks.append(setting)
            elif kept is None:
                kept = _candidate(ex, setting, agreeing, target, start, True, validate, on_discard)
                if kept is not None:
                    runs = min(max_runs, ex.runs + _CRASH_RUNS)
        elif _facts(a) == _facts(b) and any(f.startswith(("call ", "set")) for f in a.facts):
            agreeing.append(setting)
        for other in _neighbours(setting, (a, b), parameters):
            if other.key() not in visited:
                visited.add(other.key())
                queue.append(other)
    for setting in fallbacks[:_FALLBACKS]:
        if time.monotonic() - start > 2 * seconds:
            break
        crash = _candidate(ex, setting, agreeing, target, start, False, validate, on_discard)
        if crash is not None:
            return crash
    return kept


def _candidate(
    ex: _Explorer,
    main: Setting,
    agreeing: list[Setting],
    target: str,
    start: float,
    clean: bool,
    validate: Validate | None,
    on_discard: Callable[[str], None] | None,
) -> Found | None:
    """The frozen sniff of ``main``, with the nearest control ``validate`` keeps it with
    (a control is an input too: one that only one spelling agrees on is no control); a
    candidate no control saves is discarded (``on_discard`` hears why)."""
    frozen = _freeze(ex, main, agreeing)
    if frozen is None:
        return None
    why = ""
    for observation in _observations(ex, main, frozen, target):
        why = "" if validate is None else (validate(observation) or "")
        if not why:
            return Found(observation, ex.runs, time.monotonic() - start, len(ex.attributes), clean)
        if "the control call" not in why:
            break  # the main input itself reads wrong: another control will not save it
    if on_discard is not None:
        on_discard(why)
    return None


@dataclass(frozen=True)
class _Frozen:
    """The main input observed again with everything learned: what each version did, and
    the agreeing inputs nearest to it (each with the facts both versions did there)."""

    installed: Run
    fixed: Run
    controls: list[tuple[Setting, set[str]]]


def _freeze(ex: _Explorer, main: Setting, agreeing: list[Setting]) -> _Frozen | None:
    """Observe the main input and the nearest agreeing controls again with everything the
    search learned, twice each (the facts must be the same both times)."""
    a, b = ex.pair(main)
    a2, b2 = ex.pair(main)
    if _facts(a) != _facts(a2) or _facts(b) != _facts(b2):
        return None  # not deterministic: no sniff can rest on it
    only_fixed, only_installed = ex.difference(a, b)
    if not (only_fixed or only_installed):
        return None
    controls = []
    for candidate in sorted(agreeing, key=lambda s: _distance(s, main)):
        c1, c2 = ex.pair(candidate)
        if _facts(c1) == _facts(c2):
            controls.append((candidate, _facts(c1)))
            if len(controls) >= _CONTROLS:
                break
    # Last (or only, where every input the search saw tells the versions apart: the fix is
    # on every path): what both versions did on the main input.
    controls.append((main, _facts(a) & _facts(b)))
    return _Frozen(a, b, controls)


def _observations(
    ex: _Explorer, main: Setting, frozen: _Frozen, target: str
) -> Iterator[Observation]:
    """The frozen sniff of ``main`` with each control in turn, nearest first."""
    a, b = frozen.installed, frozen.fixed
    only_fixed, only_installed = ex.difference(a, b)
    anchors = _anchors(only_fixed | only_installed, _facts(a) & _facts(b))
    at_anchors = [
        tuple(sorted(f for f in _facts(run) if f.startswith(anchors) and anchors)) for run in (b, a)
    ]
    knowledge = Setting(main.arguments, main.truths, {**ex.learned, **main.lengths}, ex.attributes)
    for control, facts in frozen.controls:
        control_knowledge = Setting(
            control.arguments, control.truths, {**ex.learned, **control.lengths}, ex.attributes
        )
        yield Observation(
            target,
            ex.recorders,
            ex.module,
            knowledge.to_json(),
            tuple(sorted(only_fixed)),
            tuple(sorted(only_installed)),
            anchors,
            control_knowledge.to_json(),
            tuple(sorted(facts)),
            at_anchors[0],
            at_anchors[1],
        )
