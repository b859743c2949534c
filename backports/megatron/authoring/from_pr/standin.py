"""Stand-ins that record what a function does with them: the sniff of a derived backport.

A generated plugin carries a byte copy of this module (``_standin.py``) and nothing else of
the tool besides public names, so it imports the standard library only.

A function is called with a ``StandIn`` for every argument (``self`` and ``ctx`` too), and
the callees that would touch a GPU or a process group are ``StandIn`` recorders in the
function's private globals (``with_globals``); a dotted recorder name (``torch.distributed``)
records that submodule of a module whose other attributes stay real. A stand-in has the attributes a
``Setting`` lists and no others: reading another raises ``AttributeError``, so
``hasattr`` and ``getattr(x, name, default)`` see it absent (the search then tries it
present too: ``present``), and ``learn`` adds the attribute a call could not do without,
then calls again (the attribute-discovery loop).
What it does: calling a stand-in records a fact and returns a new stand-in; ``bool()``,
``len()`` and iteration answer what the ``Setting`` says (False, 0 and nothing by
default); comparisons and arithmetic give stand-ins. What the function did is its facts:
every call of a stand-in with what it was handed, every attribute or item it set, what it
returned or raised. Reads and questions are not facts: a version that asks more but does
the same is the same.

``judge`` compares a call's facts with what the derivation saw on the installed and on the
fixed code: the facts only the fixed code produced, those only the installed one did, and
a control call on which both agreed.
"""

import builtins
import inspect
import re
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict, cast

_UNPACK = re.compile(r"values to unpack \(expected (\d+)")
_LEARN_BUDGET = 96  # attributes and lengths one call may learn
_MAX_TEXT = 60

# A function under sniff (its ``__globals__`` are what a private copy replaces), and the
# tool's ``with_globals`` that makes that copy (passed in: this module imports no tool code).
Function = types.FunctionType
WithGlobals = Callable[[Function, Mapping[str, object]], Callable[..., object]]


class SettingJson(TypedDict):
    """A ``Setting`` as JSON (a frozen observation's ``main`` and ``control``)."""

    arguments: NotRequired[dict[str, str]]
    truths: NotRequired[dict[str, bool]]
    lengths: NotRequired[dict[str, int]]
    attributes: NotRequired[list[str]]


class ObservationJson(TypedDict):
    """An ``Observation`` as JSON (``dataclasses.asdict`` of one, read back)."""

    target: str
    recorders: list[str]
    module: str
    main: SettingJson
    fixed: list[str]
    needed: list[str]
    anchors: list[str]
    control: SettingJson
    control_facts: list[str]
    fixed_at_anchors: NotRequired[list[str]]
    installed_at_anchors: NotRequired[list[str]]


class Facts(TypedDict, total=False):
    """What ``look`` saw: route (a) the test's outcome; else the facts of both inputs."""

    test: str
    main: list[str]
    control: list[str]


class SniffEntry(TypedDict, total=False):
    """One sniffed target as a generated plugin freezes it (``SNIFFS``)."""

    route: str
    target: str
    module: str
    test: str
    observation: ObservationJson


class Mismatch(RuntimeError):
    """The function behaves like neither version, or its control call changed: the sniff
    cannot tell, so the backport is incompatible."""


@dataclass
class Setting:
    """One input: each argument (a stand-in, None, or its default), what ``bool()`` and
    ``len()`` of each stand-in say, and the attributes the stand-ins have."""

    arguments: dict[str, str] = field(default_factory=dict)  # "stand-in" | "none" | "default"
    truths: dict[str, bool] = field(default_factory=dict)
    lengths: dict[str, int] = field(default_factory=dict)
    attributes: set[str] = field(default_factory=set)

    def to_json(self) -> SettingJson:
        return {
            "arguments": dict(sorted(self.arguments.items())),
            "truths": dict(sorted(self.truths.items())),
            "lengths": dict(sorted(self.lengths.items())),
            "attributes": sorted(self.attributes),
        }

    @classmethod
    def from_json(cls, data: SettingJson) -> "Setting":
        return cls(
            dict(data.get("arguments", {})),
            dict(data.get("truths", {})),
            dict(data.get("lengths", {})),
            set(data.get("attributes", ())),
        )

    def copy(self) -> "Setting":
        return Setting.from_json(self.to_json())

    def key(self) -> str:
        """The input without its attributes (those are learned, not chosen)."""
        data = self.to_json()
        del data["attributes"]
        return repr(sorted(data.items()))


@dataclass
class Run:
    """What one call did (``facts``) and which questions it asked of the stand-ins."""

    setting: Setting
    facts: list[str] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)  # bool() of these stand-ins
    iterated: list[str] = field(default_factory=list)  # len() / iteration of these
    missed: list[str] = field(default_factory=list)  # attributes read and found absent
    calls: dict[str, int] = field(default_factory=dict)
    outcome: str = ""
    error: BaseException | None = None

    def count(self, path: str) -> int:
        n = self.calls.get(path, 0)
        self.calls[path] = n + 1
        return n


def present(attribute: str) -> str:
    """The truth that says a stand-in has an attribute that a read with a default
    (``getattr(cfg, "x", False)``, ``hasattr``) found absent: the search tries both."""
    return f"has {attribute}"


def describe(value: object) -> str:
    """A short, stable text for a value handed to a stand-in or returned."""
    if isinstance(value, StandIn):
        return f"<{object.__getattribute__(value, '_si_path')}>"
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    if isinstance(value, str):
        return repr(value[:_MAX_TEXT])
    if isinstance(value, tuple | list):
        inner = ", ".join(describe(v) for v in value[:8])
        more = ", ..." if len(value) > 8 else ""
        return f"({inner}{more})" if isinstance(value, tuple) else f"[{inner}{more}]"
    if isinstance(value, dict):
        items = list(value.items())[:8]
        return "{" + ", ".join(f"{describe(k)}: {describe(v)}" for k, v in items) + "}"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return f"tensor[{value.dtype}, {tuple(value.shape)}]"
    if torch is not None and isinstance(value, torch.dtype | torch.device):
        return str(value)
    if isinstance(value, type):
        return f"class {value.__qualname__}"
    if isinstance(value, types.FunctionType | types.MethodType | types.BuiltinFunctionType):
        return f"function {getattr(value, '__qualname__', '?')}"
    return f"<{type(value).__name__}>"


def _binary(symbol: str, reflected: bool = False) -> Callable[["StandIn", object], "StandIn"]:
    def op(self: "StandIn", other: object) -> "StandIn":
        mine = object.__getattribute__(self, "_si_path")
        left, right = (describe(other), mine) if reflected else (mine, describe(other))
        return self._si_child(f"({left} {symbol} {right})")

    return op


def _unary(symbol: str) -> Callable[["StandIn"], "StandIn"]:
    def op(self: "StandIn") -> "StandIn":
        return self._si_child(f"({symbol}{object.__getattribute__(self, '_si_path')})")

    return op


# Dunder names Python and the libraries megatron uses probe objects for (a protocol, a
# function's or class's own attributes): a stand-in never has them, and never records a
# read of them as a choice to explore. Any other dunder is a marker a program sets on its
# own objects (megatron's ``param.__fsdp_param__``): read with a default, it is explored.
_PROTOCOL_NAMES = frozenset(
    {
        name
        for kind in (object, type, int, float, list, dict, set, types.FunctionType, BaseException)
        for name in dir(kind)
        if name.startswith("__")
    }
    | {
        "__array__",
        "__array_interface__",
        "__array_priority__",
        "__array_struct__",
        "__array_function__",
        "__array_ufunc__",
        "__cuda_array_interface__",
        "__dlpack__",
        "__dlpack_device__",
        "__torch_function__",
        "__torch_dispatch__",
        "__wrapped__",
        "__func__",
        "__self__",
        "__fspath__",
        "__iter__",
        "__next__",
        "__len__",
        "__length_hint__",
        "__index__",
        "__enter__",
        "__exit__",
        "__aenter__",
        "__aexit__",
        "__await__",
        "__aiter__",
        "__anext__",
        "__call__",
        "__get__",
        "__set__",
        "__delete__",
        "__set_name__",
        "__copy__",
        "__deepcopy__",
        "__getstate__",
        "__setstate__",
        "__getnewargs__",
        "__getnewargs_ex__",
        "__reduce__",
        "__reduce_ex__",
        "__slots__",
        "__dataclass_fields__",
        "__dataclass_params__",
        "__attrs_attrs__",
        "__origin__",
        "__args__",
        "__parameters__",
        "__mro_entries__",
        "__class_getitem__",
        "__instancecheck__",
        "__subclasscheck__",
        "__signature__",
        "__text_signature__",
        "__annotations__",
        "__code__",
        "__defaults__",
        "__kwdefaults__",
        "__closure__",
        "__globals__",
        "__builtins__",
        "__file__",
        "__path__",
        "__spec__",
        "__loader__",
        "__package__",
        "__all__",
        "__version__",
        "__bool__",
        "__contains__",
        "__missing__",
        "__complex__",
        "__float__",
        "__int__",
        "__round__",
        "__trunc__",
        "__floor__",
        "__ceil__",
        "__matmul__",
        "__rmatmul__",
        "__imatmul__",
        "__buffer__",
        "__release_buffer__",
        "__objclass__",
        "__isabstractmethod__",
    }
)


class StandIn:
    """A recording stand-in at ``path`` (``self``, ``ctx.saved_tensors[1]``, ...)."""

    def __init__(self, path: str, run: Run, real: object = None) -> None:
        object.__setattr__(self, "_si_path", path)
        object.__setattr__(self, "_si_run", run)
        object.__setattr__(self, "_si_children", {})
        # What a recorder stands in for (a callee, one of its attributes), else None: a
        # call of it is recorded by the callee's own parameter names.
        object.__setattr__(self, "_si_real", real)

    def _si_child(self, path: str, real: object = None) -> "StandIn":
        children = object.__getattribute__(self, "_si_children")
        if path not in children:
            children[path] = StandIn(path, object.__getattribute__(self, "_si_run"), real)
        return children[path]  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> "StandIn":
        path = object.__getattribute__(self, "_si_path")
        run: Run = object.__getattribute__(self, "_si_run")
        key = f"{path}.{name}"
        if name not in _PROTOCOL_NAMES:
            if key in run.setting.attributes or run.setting.truths.get(present(key)):
                return self._si_child(key, _attribute_of(self, name))
            run.missed.append(key)  # getattr(x, name, default), hasattr: the other outcome
        raise AttributeError(f"stand-in {path} has no attribute {name!r}", name=name, obj=self)

    def __setattr__(self, name: str, value: object) -> None:
        path = object.__getattribute__(self, "_si_path")
        run: Run = object.__getattribute__(self, "_si_run")
        run.facts.append(f"set {path}.{name}={describe(value)}")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        path = object.__getattribute__(self, "_si_path")
        object.__getattribute__(self, "_si_run").facts.append(f"del {path}.{name}")
        object.__delattr__(self, name)

    def __call__(self, *args: object, **kwargs: object) -> "StandIn":
        path = object.__getattribute__(self, "_si_path")
        run: Run = object.__getattribute__(self, "_si_run")
        call = f"call {path}#{run.count(path)}"
        run.facts.append(call)
        bound = _bound(object.__getattribute__(self, "_si_real"), args, kwargs)
        if bound is not None:  # by parameter: positional or keyword, default or not, alike
            run.facts += [f"{call} {k}={describe(v)}" for k, v in sorted(bound.items())]
            return self._si_child(f"{call.removeprefix('call ')}()")
        run.facts += [f"{call} arg{i}={describe(a)}" for i, a in enumerate(args)]
        run.facts += [f"{call} {k}={describe(v)}" for k, v in sorted(kwargs.items())]
        return self._si_child(f"{call.removeprefix('call ')}()")

    def __bool__(self) -> bool:
        path = object.__getattribute__(self, "_si_path")
        run: Run = object.__getattribute__(self, "_si_run")
        run.asked.append(path)
        return run.setting.truths.get(path, False)

    def __len__(self) -> int:
        path = object.__getattribute__(self, "_si_path")
        run: Run = object.__getattribute__(self, "_si_run")
        run.iterated.append(path)
        return run.setting.lengths.get(path, 0)

    def __iter__(self) -> Iterator["StandIn"]:
        path = object.__getattribute__(self, "_si_path")
        return iter([self._si_child(f"{path}[{i}]") for i in range(len(self))])

    def __getitem__(self, key: object) -> "StandIn":
        return self._si_child(f"{object.__getattribute__(self, '_si_path')}[{describe(key)}]")

    def __setitem__(self, key: object, value: object) -> None:
        path = object.__getattribute__(self, "_si_path")
        run: Run = object.__getattribute__(self, "_si_run")
        run.facts.append(f"setitem {path}[{describe(key)}]={describe(value)}")

    def __delitem__(self, key: object) -> None:
        path = object.__getattribute__(self, "_si_path")
        object.__getattribute__(self, "_si_run").facts.append(f"delitem {path}[{describe(key)}]")

    def __contains__(self, item: object) -> bool:
        path = object.__getattribute__(self, "_si_path")
        return bool(self._si_child(f"({describe(item)} in {path})"))

    def __enter__(self) -> "StandIn":
        path = object.__getattribute__(self, "_si_path")
        object.__getattribute__(self, "_si_run").facts.append(f"enter {path}")
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __instancecheck__(self, instance: object) -> bool:
        """``isinstance(x, Recorded)`` (a recorded class): a question, as ``bool()`` is."""
        path = object.__getattribute__(self, "_si_path")
        return bool(self._si_child(f"(isinstance {describe(instance)} {path})"))

    def __subclasscheck__(self, subclass: type) -> bool:
        path = object.__getattribute__(self, "_si_path")
        return bool(self._si_child(f"(issubclass {describe(subclass)} {path})"))

    def __hash__(self) -> int:
        return hash(object.__getattribute__(self, "_si_path"))

    def __repr__(self) -> str:
        return f"<stand-in {object.__getattribute__(self, '_si_path')}>"

    def __index__(self) -> int:
        raise TypeError(f"{self!r} is not a number")

    __eq__ = _binary("==")  # type: ignore[assignment]
    __ne__ = _binary("!=")  # type: ignore[assignment]
    __lt__ = _binary("<")
    __le__ = _binary("<=")
    __gt__ = _binary(">")
    __ge__ = _binary(">=")
    __add__ = _binary("+")
    __radd__ = _binary("+", reflected=True)
    __sub__ = _binary("-")
    __rsub__ = _binary("-", reflected=True)
    __mul__ = _binary("*")
    __rmul__ = _binary("*", reflected=True)
    __truediv__ = _binary("/")
    __rtruediv__ = _binary("/", reflected=True)
    __floordiv__ = _binary("//")
    __rfloordiv__ = _binary("//", reflected=True)
    __mod__ = _binary("%")
    __rmod__ = _binary("%", reflected=True)
    __pow__ = _binary("**")
    __matmul__ = _binary("@")
    __rmatmul__ = _binary("@", reflected=True)
    __and__ = _binary("&")
    __rand__ = _binary("&", reflected=True)
    __or__ = _binary("|")
    __ror__ = _binary("|", reflected=True)
    __neg__ = _unary("-")
    __pos__ = _unary("+")
    __invert__ = _unary("~")
    __abs__ = _unary("abs ")


class _ModuleView:
    """A module as a private copy of a vendored function sees it: ``overrides`` first."""

    def __init__(self, module: Callable[[], object], overrides: Mapping[str, object]) -> None:
        self._module = module
        self._overrides = dict(overrides)

    def __getattr__(self, name: str) -> object:
        if name in self._overrides:
            return self._overrides[name]
        return getattr(self._module(), name)


def _attribute_of(stand_in: StandIn, name: str) -> object:
    """The real attribute behind a recorder's (``AutoTokenizer.from_pretrained``), or None."""
    real = object.__getattribute__(stand_in, "_si_real")
    if real is None:
        return None
    try:
        return inspect.getattr_static(real, name, None) and getattr(real, name)
    except Exception:  # a property of the class, a lazy import: no signature then
        return None


def _bound(
    real: object, args: tuple[object, ...], kwargs: dict[str, object]
) -> dict[str, object] | None:
    """A recorded call's arguments by the real callee's parameter names (``f(x, None)``
    and ``f(x, group=None)`` are one call); None where the callee has no signature or does
    not take them (recorded as handed). Defaults are not filled in: a later release's new
    parameter changes no fact."""
    if real is None or not callable(real):
        return None
    try:
        signature = inspect.signature(real)
        bound = signature.bind(*args, **kwargs)
    except (TypeError, ValueError):
        return None
    found: dict[str, object] = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            found.update({f"{name}[{i}]": v for i, v in enumerate(value)})
        elif kind is inspect.Parameter.VAR_KEYWORD:
            found.update(value)
        else:
            found[name] = value
    return found


# A recorder name ``torch.*``: of that module, every function handed a stand-in is recorded.
HANDED_A_STAND_IN = "*"
# A recorder name: what the function imports from megatron in its own body (``from
# megatron.core.x import Scaler``) is recorded too, as a module global would be.
LOCAL_IMPORTS = "__import__"


def _recordable(value: object) -> bool:
    """A function or class a recorder may stand in for (an exception class stays real:
    ``except`` needs it)."""
    if not callable(value) or isinstance(value, types.ModuleType):
        return False
    return not (isinstance(value, type) and issubclass(value, BaseException))


def _recording_builtins(function: Function, run: Run) -> dict[str, object]:
    """The function's builtins with an ``__import__`` that hands ``from megatron... import
    Name`` a recorder for each name: a class the function imports in its body
    (``DSAIndexerLossAutoScaler.set_loss_scale``) is then never called for real, which
    would set its real state to a stand-in."""
    own = function.__globals__.get("__builtins__", builtins)
    namespace = dict(vars(own) if isinstance(own, types.ModuleType) else own)
    real_import = namespace["__import__"]

    def recording_import(
        name: str,
        globals: Mapping[str, object] | None = None,
        locals: Mapping[str, object] | None = None,
        fromlist: tuple[str, ...] | list[str] | None = (),
        level: int = 0,
    ) -> object:
        module = real_import(name, globals, locals, fromlist, level)
        if not fromlist or not getattr(module, "__name__", "").startswith("megatron"):
            return module
        recorded = {
            n: StandIn(n, run, getattr(module, n))
            for n in fromlist
            if _recordable(getattr(module, n, None))
        }
        return _RecordingModule(module, recorded) if recorded else module

    namespace["__import__"] = recording_import
    return namespace


def _holds_stand_in(value: object, depth: int = 3) -> bool:
    """A stand-in, or a list, tuple, set or dict holding one (a few levels down)."""
    if isinstance(value, StandIn):
        return True
    if depth <= 0:
        return False
    if isinstance(value, dict):
        value = [*value.keys(), *value.values()]
    if isinstance(value, list | tuple | set | frozenset):
        return any(_holds_stand_in(item, depth - 1) for item in value)
    return False


def _on_a_gpu(kwargs: Mapping[str, object]) -> bool:
    """The call asks for a CUDA device (``device="cuda"``, ``"cuda:1"``, a
    ``torch.device("cuda")``): told by its text, as this module imports no torch."""
    return str(kwargs.get("device", "")).startswith("cuda")


class _WhereHandedAStandIn:
    """A module's function that runs for real, unless it is handed a stand-in (which no
    real ``torch.count_nonzero`` takes) or asked for a CUDA device (``torch.zeros(1,
    device="cuda")``: what the fix hands it is the fact, and a machine without a GPU could
    not run it while one with a GPU would: recorded on every machine alike, a sniff made
    on CPU replays the same on a GPU): then the call is recorded, as a recorder's is."""

    def __init__(self, real: Callable[..., object], path: str, run: Run) -> None:
        self._real, self._path, self._run = real, path, run

    def __call__(self, *args: object, **kwargs: object) -> object:
        if _holds_stand_in(args) or _holds_stand_in(kwargs) or _on_a_gpu(kwargs):
            return StandIn(self._path, self._run, self._real)(*args, **kwargs)
        return self._real(*args, **kwargs)


class _RecordingModule:
    """A module some of whose submodules are recorders (``torch`` with ``torch.distributed``
    and ``torch.cuda`` recorded, named ``torch.distributed`` in ``recorders``): every other
    attribute is the module's own. With ``run`` (``torch.*`` in ``recorders``), its
    functions and those of its submodules are recorded where handed a stand-in."""

    def __init__(
        self,
        module: object,
        recorded: Mapping[str, StandIn],
        run: Run | None = None,
        path: str = "",
    ) -> None:
        self._module = module
        self._recorded = dict(recorded)
        self._run, self._path = run, path

    def __getattr__(self, name: str) -> object:
        if name in self._recorded:
            return self._recorded[name]
        value = getattr(self._module, name)
        if self._run is None or isinstance(value, type):
            return value  # a class stays itself (isinstance, a subclass)
        path = f"{self._path}.{name}"
        if isinstance(value, types.ModuleType):
            home = getattr(self._module, "__name__", "")
            inside = value.__name__.startswith(f"{home}.")
            return _RecordingModule(value, {}, self._run, path) if inside else value
        if isinstance(value, types.FunctionType | types.BuiltinFunctionType):
            return _WhereHandedAStandIn(value, path, self._run)
        return value


def _recorder_globals(
    recorders: tuple[str, ...], run: Run, function: Function, module: str
) -> dict[str, object]:
    """The private globals ``recorders`` names: a stand-in for a plain name, a module with
    recorded submodules for a dotted one (the module itself as the function reads it, or as
    ``module`` has it where vendored code reads it live), whose functions are recorded
    where handed a stand-in for ``name.*``."""
    found: dict[str, object] = {}
    submodules: dict[str, dict[str, StandIn]] = {}
    guarded: set[str] = set()
    for name in recorders:
        top, _, rest = name.partition(".")
        if name == LOCAL_IMPORTS:
            found["__builtins__"] = _recording_builtins(function, run)
            continue
        real = _real_global(function, module, top)
        if rest == HANDED_A_STAND_IN:
            guarded.add(top)
            submodules.setdefault(top, {})
        elif rest:
            submodules.setdefault(top, {})[rest] = StandIn(name, run, getattr(real, rest, None))
        else:
            found[name] = StandIn(name, run, real)
    for top, recorded in submodules.items():
        real = _real_global(function, module, top)
        found[top] = _RecordingModule(real, recorded, run if top in guarded else None, top)
    return found


def _real_global(function: Function, module: str, name: str) -> object:
    """The global as the function reads it, or as ``module`` has it where vendored code
    reads it live."""
    return function.__globals__.get(name, getattr(sys.modules.get(module), name, None))


def _private_copy(
    function: Function,
    recorders: Mapping[str, object],
    module: str,
    with_globals: WithGlobals,
) -> Callable[..., object]:
    """``function`` seeing ``recorders`` in place of those globals of ``module``, whether it
    reads them directly (the installed code), through ``_live_target()`` or through
    ``_live_module(module)`` (vendored code)."""
    overrides = dict(recorders)
    live_module = function.__globals__.get("_live_module")
    if callable(live_module):

        def private_live_module(name: str) -> object:
            if name != module:
                return live_module(name)
            return _ModuleView(lambda: live_module(name), recorders)

        overrides["_live_module"] = private_live_module
    return with_globals(function, overrides)


# The numbers tried for a parameter whose default is a number (``norm_type=2``), by the
# name an input records: the edges a fix for a numeric argument is about.
NUMBERS = {"inf": float("inf"), "zero": 0, "negative": -1}


def _arguments(function: Function, setting: Setting, run: Run) -> dict[str, object]:
    arguments: dict[str, object] = {}
    for name, parameter in inspect.signature(function).parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        has_default = parameter.default is not parameter.empty
        choice = setting.arguments.get(name, "default" if has_default else "stand-in")
        if choice == "default" and has_default:
            continue
        if choice in NUMBERS:
            arguments[name] = NUMBERS[choice]
        else:
            arguments[name] = None if choice == "none" else StandIn(name, run)
    return arguments


def call(
    function: Function,
    setting: Setting,
    recorders: tuple[str, ...],
    module: str,
    with_globals: WithGlobals,
) -> Run:
    """One call of ``function`` with stand-ins as ``setting`` says; never raises."""
    run = Run(setting)
    kwargs = _arguments(function, setting, run)
    positional_only = [
        name
        for name, p in inspect.signature(function).parameters.items()
        if p.kind == p.POSITIONAL_ONLY and name in kwargs
    ]
    args = [kwargs.pop(name) for name in positional_only]
    stand_ins = _recorder_globals(recorders, run, function, module)
    private = _private_copy(function, stand_ins, module, with_globals)
    try:
        value = private(*args, **kwargs)
    except Exception as exc:  # what the code raised is a fact like any other
        run.error = exc
        run.outcome = f"raise {type(exc).__name__}"
    else:
        run.outcome = f"return {describe(value)}"
    run.facts.append(run.outcome)
    return run


def learn(run: Run) -> bool:
    """Add to the run's setting what its call could not do without (an attribute a
    stand-in lacked, how many items a stand-in unpacks to); False when nothing to learn."""
    error = run.error
    if isinstance(error, AttributeError) and isinstance(getattr(error, "obj", None), StandIn):
        path = object.__getattribute__(error.obj, "_si_path")
        key = f"{path}.{error.name}"
        if key not in run.setting.attributes:
            run.setting.attributes.add(key)
            return True
    if isinstance(error, ValueError) and run.iterated:
        match = _UNPACK.search(str(error))
        if match is not None and run.setting.lengths.get(run.iterated[-1]) != int(match[1]):
            run.setting.lengths[run.iterated[-1]] = int(match[1])
            return True
    return False


def observe(
    function: Function,
    setting: Setting,
    recorders: tuple[str, ...],
    module: str,
    with_globals: WithGlobals,
    budget: int = _LEARN_BUDGET,
) -> Run:
    """Call ``function`` until nothing is left to learn (``setting`` grows in place)."""
    run = call(function, setting, recorders, module, with_globals)
    for _ in range(budget):
        if not learn(run):
            break
        run = call(function, setting, recorders, module, with_globals)
    return run


@dataclass(frozen=True)
class Observation:
    """What the derivation froze for one target: the input that tells the versions apart
    (``main``) and the facts that do (``fixed`` only the fixed code produced, ``needed``
    only the installed one), the facts the difference happens at (``anchors``), and a
    control input both versions agreed on, with its facts."""

    target: str
    recorders: tuple[str, ...]
    module: str
    main: SettingJson
    fixed: tuple[str, ...]
    needed: tuple[str, ...]
    anchors: tuple[str, ...]
    control: SettingJson
    control_facts: tuple[str, ...]
    # Everything each version did at the anchors (a call: its every argument).
    fixed_at_anchors: tuple[str, ...] = ()
    installed_at_anchors: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: ObservationJson) -> "Observation":
        return cls(
            data["target"],
            tuple(data["recorders"]),
            data["module"],
            data["main"].copy(),
            tuple(data["fixed"]),
            tuple(data["needed"]),
            tuple(data["anchors"]),
            data["control"].copy(),
            tuple(data["control_facts"]),
            tuple(data.get("fixed_at_anchors", ())),
            tuple(data.get("installed_at_anchors", ())),
        )


def seen(function: Function, observation: Observation, with_globals: WithGlobals) -> Facts:
    """The facts of ``function`` on the observation's two inputs (JSON-able)."""
    o = observation
    main = observe(function, Setting.from_json(o.main), o.recorders, o.module, with_globals)
    control = observe(function, Setting.from_json(o.control), o.recorders, o.module, with_globals)
    return {"main": sorted(set(main.facts)), "control": sorted(set(control.facts))}


def _same_at(seen: set[str], frozen: tuple[str, ...]) -> bool:
    """What the call did at the anchors is what that version did (every argument): one
    that passes something else there behaves like neither."""
    return not frozen or seen == set(frozen)


def judge(facts: Facts, observation: Observation) -> bool:
    """Fixed (True) or not (False), from ``seen``'s facts; ``Mismatch`` when neither."""
    o = observation
    control = set(facts["control"])
    lost = [fact for fact in o.control_facts if fact not in control]
    if lost:
        raise Mismatch(f"{o.target}: the control call no longer does {lost[0]!r}")
    main = set(facts["main"])
    missing = [fact for fact in o.anchors if fact not in main]
    if missing:
        raise Mismatch(f"{o.target}: the call the versions differ at is gone: {missing[0]!r}")
    fixed_seen = [f in main for f in o.fixed]
    needed_seen = [f in main for f in o.needed]
    at_anchors = {f for f in main if o.anchors and f.startswith(o.anchors)}
    if all(fixed_seen) and not any(needed_seen) and _same_at(at_anchors, o.fixed_at_anchors):
        return True
    if all(needed_seen) and not any(fixed_seen) and _same_at(at_anchors, o.installed_at_anchors):
        return False
    shown = (
        [f for f, s in zip(o.fixed, fixed_seen, strict=True) if not s]
        or [f for f, s in zip(o.needed, needed_seen, strict=True) if s]
        or sorted(at_anchors ^ set(o.fixed_at_anchors))
        or ["?"]
    )
    raise Mismatch(f"{o.target}: behaves like neither version (at {shown[0]!r})")


# ---- route (a): the pull request's own test, run on a target -------------------------------


def _as_held(held: object, function: Function) -> object:
    """``function`` as the class holds the member it replaces (a static method, a class
    method, a property's getter with the property's setter and deleter kept)."""
    if isinstance(held, staticmethod):
        return staticmethod(function)
    if isinstance(held, classmethod):
        return classmethod(function)
    if isinstance(held, property):
        return property(function, held.fset, held.fdel, held.__doc__)
    return function


def test_binding(module_name: str, attribute: str, function: Function) -> tuple[str, object]:
    """(the name a test uses for the target, what to bind it to in the test's private
    globals): the function itself, or a subclass of its class whose method is ``function``
    (a property's getter: a property of it, with the class's setter, deleter and doc; the
    live class is never written)."""
    import importlib

    module = importlib.import_module(module_name)
    owner_name, _, name = attribute.rpartition(".")
    if not owner_name:
        return name, function
    owner = getattr(module, owner_name)
    member = _as_held(vars(owner)[name], function)
    return owner_name, type(owner_name, (owner,), {name: member, "__module__": owner.__module__})


def _resolves_at(cls: type, name: str, owner: type) -> bool:
    """``cls`` is ``owner`` or a subclass that takes ``name`` from ``owner`` (none of the
    classes before it in the MRO defines it): the test reaches the target through it."""
    mro = getattr(cls, "__mro__", ())
    if owner not in mro:
        return False
    return next((c for c in mro if name in c.__dict__), None) is owner


def _subclass_with(cls: type, name: str, member: object) -> type | None:
    """A subclass of ``cls`` whose ``name`` is ``member`` (the live class is never
    written), or None where ``cls`` cannot be subclassed (an enum with members, a final
    class)."""
    try:
        return type(
            cls.__name__,
            (cls,),
            {name: member, "__module__": cls.__module__, "__qualname__": cls.__qualname__},
        )
    except TypeError:
        return None


def route_a_bindings(
    namespace: Mapping[str, object], module_name: str, attribute: str, function: Function
) -> dict[str, object]:
    """What to rebind in a test's namespace so that the test runs ``function`` as the
    target: each name bound to the target itself; each class that reaches the target's
    method (its class, or a subclass that inherits the method: ``ByteLevelTokenizer`` for
    ``MegatronTokenizerTextAbstract.cls_id``) as a subclass whose method is ``function``;
    the target's module (``import rope_utils as m; m._apply(...)``) as a copy of it whose
    attribute is. Empty where the test reaches nothing of the target. Nothing live is
    written."""
    import importlib

    module = importlib.import_module(module_name)
    owner_name, _, name = attribute.rpartition(".")
    bound: dict[str, object] = {}
    replaced: dict[str, object] = {name: function}
    if not owner_name:
        live = vars(module).get(name)
        bound = {k: function for k, v in namespace.items() if v is live and live is not None}
    else:
        owner = getattr(module, owner_name)
        member = _as_held(vars(owner)[name], function)
        for key, value in namespace.items():
            if isinstance(value, type) and _resolves_at(value, name, owner):
                made = _subclass_with(value, name, member)
                if made is not None:
                    bound[key] = made
        replaced = {owner_name: _subclass_with(owner, name, member) or owner}
    for key, value in namespace.items():
        if value is module:
            view = types.ModuleType(module.__name__, module.__doc__)
            view.__dict__.update({**vars(module), **replaced})
            bound[key] = view
    return bound


def run_upstream_test(
    source: str,
    test: str,
    module_name: str,
    attribute: str,
    function: Function,
    inside: types.CodeType | None = None,
) -> str:
    """``run_test``'s outcome for the test ``test`` defined by ``source`` (a pull request's
    test with its imports and helpers), run afresh with ``function`` as the target
    (``route_a_bindings``): the test and every helper it calls see it, the live module and
    class do not. "error ..." where the source does not load or reaches nothing of the
    target."""
    namespace: dict[str, object] = {"__name__": "_backports_upstream_test"}
    try:
        exec(compile(source, "<upstream test>", "exec"), namespace)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # its imports need the test tree, a GPU, ... (or skip)
        first = (str(exc).splitlines() or [""])[0][:120]
        return f"error {type(exc).__name__}: does not load here: {first}"
    bound = route_a_bindings(namespace, module_name, attribute, function)
    if not bound:
        return f"error: the test reaches nothing of {attribute}"
    namespace.update(bound)
    return _outcome(cast(Callable[[], object], namespace[test]), inside)


def _is_pytest_failure(exc: BaseException) -> bool:
    """``pytest.fail`` and a ``pytest.raises`` that saw nothing raise ``Failed``, which
    derives from ``BaseException``, not ``Exception`` (told by name: pytest need not be
    importable where the test runs)."""
    outcome = any(
        cls.__module__ == "_pytest.outcomes" and cls.__name__ == "OutcomeException"
        for cls in type(exc).__mro__
    )
    return outcome and any(cls.__name__ == "Failed" for cls in type(exc).__mro__)


# What an error says when it comes from the machine, not from the code under test: no GPU,
# no Transformer Engine, no process group, no network.
_ENVIRONMENT = re.compile(
    r"cuda|nccl|\bgpu\b|nvidia|transformer.?engine|\bapex\b|triton|process group|"
    r"default process group|not initialized|network|connection|name resolution|timed out",
    re.IGNORECASE,
)


def _is_pytest_outcome(exc: BaseException) -> bool:
    """A skip, an xfail, an exit: pytest's ``OutcomeException``s other than ``Failed``."""
    return any(
        cls.__module__ == "_pytest.outcomes" and cls.__name__ == "OutcomeException"
        for cls in type(exc).__mro__
    ) and not _is_pytest_failure(exc)


def environmental(exc: BaseException) -> bool:
    """The error says the environment lacks something (a module, a GPU, Transformer
    Engine, the network), or the test skipped itself: the code under test said nothing."""
    if isinstance(exc, ImportError | ConnectionError | TimeoutError) or _is_pytest_outcome(exc):
        return True
    if isinstance(exc, OSError) and type(exc).__name__ in ("gaierror", "herror", "URLError"):
        return True
    return bool(_ENVIRONMENT.search(f"{type(exc).__name__}: {exc}"))


def _codes(code: types.CodeType) -> set[types.CodeType]:
    """A function's code and that of the functions, lambdas, comprehensions it defines."""
    found = {code}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= _codes(const)
    return found


def _raised_inside(exc: BaseException, code: types.CodeType) -> bool:
    codes = _codes(code)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    return False


def run_test(
    test: Function,
    name: str,
    value: object,
    with_globals: WithGlobals,
    inside: types.CodeType | None = None,
) -> str:
    """``_outcome`` of ``test()`` run with ``name`` bound to ``value`` in its globals."""
    return _outcome(with_globals(test, {name: value}), inside)


def _outcome(test: Callable[[], object], inside: types.CodeType | None) -> str:
    """ "passed", "failed..." or "error <type>: <line>" for ``test()``. Failed: an
    assertion, pytest's ``Failed``, or (with ``inside``, the code of the function under
    judgement) an exception raised from inside that function's frames, as pytest calls it
    FAILED too, unless it says the environment lacks something (``environmental``: an
    import, a skip, CUDA, Transformer Engine, the network). Whatever the test raises is its
    outcome, ``BaseException`` included (pytest's outcomes, ``SystemExit``): a test never
    ends the process running it; only a Ctrl-C goes on."""
    try:
        test()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # its outcome, as pytest would report it
        if _is_pytest_failure(exc):
            return "failed"
        if isinstance(exc, AssertionError) and not _ENVIRONMENT.search(str(exc)):
            return "failed"
        first = (str(exc).splitlines() or [""])[0][:120]
        if inside is not None and _raised_inside(exc, inside) and not environmental(exc):
            return f"failed: raised {type(exc).__name__} inside {inside.co_name}: {first}"
        return f"error {type(exc).__name__}: {first}"
    return "passed"


def is_failure(outcome: str) -> bool:
    return outcome == "failed" or outcome.startswith("failed: ")


# ---- one sniffed target, whichever route made it -----------------------------------------


def look(
    function: Function, entry: SniffEntry, with_globals: WithGlobals, tests: object = None
) -> Facts:
    """What ``function`` does on the entry's inputs (JSON-able)."""
    if entry["route"] == "a":  # the carried tests' module, run afresh on ``function``
        source = inspect.getsource(cast(types.ModuleType, tests))
        outcome = run_upstream_test(
            source, entry["test"], entry["module"], entry["target"], function, function.__code__
        )
        return {"test": outcome}
    return seen(function, Observation.from_json(entry["observation"]), with_globals)


def decide(facts: Facts, entry: SniffEntry) -> bool:
    """Fixed or not from ``look``'s result; ``Mismatch`` when it cannot tell."""
    if entry["route"] == "a":
        if facts["test"] == "passed" or is_failure(facts["test"]):
            return bool(facts["test"] == "passed")
        raise Mismatch(f"{entry['target']}: the upstream test {entry['test']}: {facts['test']}")
    return judge(facts, Observation.from_json(entry["observation"]))
