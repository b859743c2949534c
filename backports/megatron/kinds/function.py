"""The function kind: a module-level function, or a method (plain or static) of a class,
or the getter of a class's property.

A function is held by its defining module and by every module that imported it by name: the
replacement goes to all of them. A method is set on the class that defines it, never on a
subclass or a forwarder. A decorated original (``torch.compile``'s wrapper, ``custom_bwd``:
the entry declares the decorator) is replaced by the live decorator applied to the vendored
body, behind a plain shim that carries the markers (``__backport__``, ``__wrapped__``), so
the decorator's own ``__wrapped__`` is never overwritten. A property is replaced by a new
property of the vendored getter with the original's setter, deleter and doc; revert puts the
original property object back. Its getter is what the sniff, the signature check and the
fingerprint read.
"""

import contextlib
import hashlib
import importlib
import inspect
import logging
import marshal
import os
import sys
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from types import ModuleType
from typing import Any, cast

from ..evidence.fingerprints import installed_file
from ..model import ResolvedTarget, Target
from . import Part, Site
from ._base import BaseKind, callable_replacement, lacking
from ._bindings import live_namespace, rebind_everywhere, restore_everywhere
from ._built_before import built_before, routed

_LOG = logging.getLogger(__name__)


def compiled_body(obj: object) -> Callable[..., object] | None:
    """The function torch.compile wrapped, when ``obj`` is its wrapper; else None.

    torch.compile's wrapper carries the body both as ``_torchdynamo_orig_callable`` and as
    ``__wrapped__``; a third party's ``functools.wraps`` around it copies the first but sets
    its own ``__wrapped__``, so it is not mistaken for the decorator.
    """
    body = getattr(obj, "_torchdynamo_orig_callable", None)
    if body is not None and getattr(obj, "__wrapped__", None) is body:
        return body
    return None


def live_decorator(path: str) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """The decorator named "module:name", read now: megatron may switch it at run time
    (``megatron.core.jit`` rebinds ``jit_fuser``)."""
    module_name, _, name = path.partition(":")
    decorator = getattr(importlib.import_module(module_name), name)
    if not callable(decorator):
        raise TypeError(f"decorator {path} is {type(decorator).__name__}, not callable")
    return decorator  # type: ignore[no-any-return]


class MarkedProperty(property):
    """The property the kind installs: a plain ``property`` in every way (getter, setter,
    deleter, doc), with the ``__dict__`` a plain one lacks, so the class's attribute carries
    the markers (``__backport__``, ``__wrapped__`` = the original property) as a replaced
    method does: status, the contract kit and a plugin's tests read them off the class."""

    __backport__: str
    __wrapped__: property


def _ours(held: Any, backport_id: str) -> tuple[Any, Callable[..., object] | None]:
    """(what stood there before us, our replacement or None) for the object a site holds."""
    if getattr(held, "__backport__", None) == backport_id:
        # A staticmethod's own ``__wrapped__`` is its function: what stood before is on that.
        inner: Any = held.__func__ if isinstance(held, staticmethod) else held
        return inner.__wrapped__, held
    return held, None


def _source_file(path: str | None) -> str | None:
    return os.path.realpath(path) if path else None


def _foreign(function: Callable[..., object], defining: ModuleType) -> str | None:
    """Why ``function`` is not the defining module's own function, or None.

    Another patch in place shows as a wrapper (``__wrapped__``, as ``functools.wraps``
    leaves it) or as code compiled from another file than the module's source.
    """
    name = f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', '?')}"
    if getattr(function, "__wrapped__", None) is not None:
        # functools.wraps copies the wrapped function's names: its code says who it is.
        code = getattr(function, "__code__", None)
        who = f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})" if code else name
        return f"already wrapped by another patch: {who} wraps {name}"
    module_file = getattr(defining, "__file__", None)
    if not module_file or not module_file.endswith(".py"):
        return None  # no source to compare with (a sourceless or built-in module)
    code_file = function.__code__.co_filename
    if _source_file(code_file) != _source_file(module_file):
        return f"already replaced by another patch: {name} is defined in {code_file}"
    return None


def _decorated_body(
    original: Callable[..., object], target: Target
) -> tuple[Callable[..., object] | None, str | None]:
    """(the undecorated body when ``original`` is the declared decorator's wrapper, else
    None; why it cannot be patched, or None)."""
    compiled = compiled_body(original)
    if compiled is not None and target.decorator is None:
        return None, "compiled by torch.compile, but the catalog entry declares no decorator"
    body = compiled
    if body is None and target.decorator is not None:
        body = _declared_body(original, target.decorator)
    return body, None


def _shape_probe(*args: object, **kwargs: object) -> None:
    """What ``_declared_body`` decorates to learn the code of a decorator's wrapper."""


def _declared_body(function: object, decorator: str) -> Callable[..., object] | None:
    """The function ``function`` wraps when it is the declared decorator's wrapper (a
    ``functools.wraps`` closure as ``torch.no_grad``'s or ``custom_bwd``'s): its code is the
    very code that decorator gives every function it wraps. Else None: another wrapper
    (``functools.lru_cache``'s, a monkeypatch's) is not taken for the declared one."""
    if getattr(function, "__wrapped__", None) is None or not inspect.isfunction(function):
        return None
    try:
        made = live_decorator(decorator)(_shape_probe)
    except Exception:  # a decorator that cannot be read or applied: not the declared shape
        return None
    wrapped = getattr(function, "__wrapped__", None)
    return wrapped if getattr(made, "__code__", None) is function.__code__ else None


def _getter_refusal(getter: object, target: Target) -> str | None:
    """Why a property's getter cannot be swapped, or None for a plain function (a getter
    that is itself decorated, an ``lru_cache`` say, would lose its wrapper)."""
    if target.decorator is not None:
        return (
            f"a property, yet the catalog entry declares the decorator {target.decorator}: "
            "only a property of a plain getter is carried"
        )
    if getattr(getter, "__wrapped__", None) is not None or not inspect.isfunction(getter):
        code = getattr(getter, "__code__", None)
        who = f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})" if code else getter
        return (
            f"a property whose getter is wrapped by {who}: only a property of a plain "
            "getter is carried"
        )
    return None


def _function_of(
    before: Any, target: Target, where: str
) -> tuple[Callable[..., object], Callable[..., object] | None, str | None]:
    """(the function the owner's object stands for: a static method's function, a
    property's getter, else the object itself; the undecorated body when that is the
    declared decorator's wrapper, else None; why it cannot be patched, or None)."""
    if isinstance(before, property):
        if before.fget is None:
            raise TypeError(f"{where} is a property without a getter")
        return before.fget, None, _getter_refusal(before.fget, target)
    original = before.__func__ if isinstance(before, staticmethod) else before
    body, refused = _decorated_body(original, target)
    return original, body, refused


def _resolved(
    module: ModuleType,
    target: Target,
    held: object,
    backport_id: str,
    defining: ModuleType,
    owner: type | None = None,
) -> ResolvedTarget:
    """The target as found in ``module``: its body checked, and whether it is foreign."""
    before, installed = _ours(held, backport_id)
    where = f"{module.__name__}.{target.attribute}"
    original, body, refused = _function_of(before, target, where)
    if not inspect.isfunction(body or original) and refused is None:
        raise TypeError(f"{where} is {type(original).__name__}")
    return ResolvedTarget(
        module.__name__,
        defining,
        target.attribute,
        original,
        installed,
        refused or _foreign(body or original, defining),
        owner,
        decorated=body is not None,
        held=before,
    )


def _in_module(module: ModuleType, target: Target, backport_id: str) -> ResolvedTarget | None:
    # getattr, not vars(): a PEP 562 forwarder hands out the function of the new module.
    function = getattr(module, target.attribute, None)
    if function is None:
        return None
    original, installed = _ours(function, backport_id)
    # Rebind where the function lives, never on a forwarder; fall back to the module we
    # found it in only when the defining module does not hold it under this name.
    defining = sys.modules.get(getattr(original, "__module__", "")) or module
    bound = vars(defining).get(target.attribute)
    if bound is None or (bound is not original and bound is not installed):
        defining = module
    return _resolved(module, target, function, backport_id, defining)


def _owner_in(module: ModuleType, target: Target) -> tuple[str, type] | None:
    """The class holding a method target in ``module`` (by its name, else by a name it
    has in another release) and the name it was found under; None where none is a class
    that defines the method (an inherited method is not defined here)."""
    assert target.owner_name is not None
    for name in (target.owner_name, *target.owner_renamed):
        owner = getattr(module, name, None)
        if isinstance(owner, type) and target.name in vars(owner):
            return name, owner
    return None


def _in_class(module: ModuleType, target: Target, backport_id: str) -> ResolvedTarget | None:
    found = _owner_in(module, target)
    if found is None:
        return None  # no such class, or the method is inherited: not defined here
    owner_name, owner = found
    defining = sys.modules.get(owner.__module__) or module
    if getattr(defining, owner_name, None) is not owner:
        defining = module
    # vars(), not getattr(): the exact object in the class dict is what revert puts back.
    return _resolved(module, target, vars(owner)[target.name], backport_id, defining, owner)


def find_in(module: ModuleType, target: Target, backport_id: str) -> ResolvedTarget | None:
    """The target as ``module`` holds it, or None."""
    if target.owner_name is None:
        return _in_module(module, target, backport_id)
    return _in_class(module, target, backport_id)


def _copy_function(vendored: object) -> types.FunctionType:
    """A fresh function object, so markers never land on the vendored module's own function."""
    if not isinstance(vendored, types.FunctionType):
        raise TypeError(f"vendored replacement is {type(vendored).__name__}, not a function")
    copy = types.FunctionType(
        vendored.__code__,
        vendored.__globals__,
        vendored.__name__,
        vendored.__defaults__,
        vendored.__closure__,
    )
    copy.__kwdefaults__ = vendored.__kwdefaults__
    copy.__doc__ = vendored.__doc__
    copy.__qualname__ = vendored.__qualname__
    copy.__module__ = vendored.__module__
    copy.__annotations__ = dict(vendored.__annotations__)
    copy.__dict__.update(vendored.__dict__)
    return copy


def _shim(body: Callable[..., object], like: types.FunctionType) -> types.FunctionType:
    """A plain function calling ``body`` (a decorator's wrapper): markers set on it never
    overwrite the ``__wrapped__`` that the decorator keeps on its own wrapper."""

    def shim(*args: object, **kwargs: object) -> object:
        return body(*args, **kwargs)

    shim.__name__, shim.__qualname__ = like.__name__, like.__qualname__
    shim.__module__, shim.__doc__ = like.__module__, like.__doc__
    shim.__backport_body__ = body  # type: ignore[attr-defined]
    assert isinstance(shim, types.FunctionType)
    return shim


def _made(
    resolved: ResolvedTarget,
    target: Target,
    vendored: object,
    backport_id: str,
    markers: Mapping[str, object],
) -> object:
    """The object to put in the owner: a marked copy of the vendored function; for a
    decorated original, a marked shim around the live decorator applied to such a copy;
    for a static method, that inside a ``staticmethod`` marked with the id too (what the
    class hands out, the function inside, carries both markers: a ``staticmethod``'s own
    ``__wrapped__`` is its function, read-only); for a property, a marked property of such
    a copy (wrapping the original getter) with the original's setter, deleter and doc."""
    made: Any = _copy_function(vendored)
    if resolved.decorated:
        if target.decorator is None:
            raise TypeError(f"{target.attribute} is decorated: no decorator declared")
        made = _shim(live_decorator(target.decorator)(made), made)
    made.__dict__.update(markers)
    made.__backport__ = backport_id
    held = resolved.held
    # A getter wraps the original getter: ``inspect.unwrap`` of it still ends at a function.
    made.__wrapped__ = resolved.original if isinstance(held, property) else held
    if isinstance(held, property):
        marked = MarkedProperty(made, held.fset, held.fdel, held.__doc__)
        marked.__dict__.update(markers)
        marked.__backport__ = backport_id
        marked.__wrapped__ = held  # what ``_ours`` and revert read: the very original
        return marked
    if isinstance(held, staticmethod):
        made = staticmethod(made)
        made.__dict__.update(markers)
        made.__backport__ = backport_id
    return made


def _olds(resolved: ResolvedTarget) -> list[object]:
    """What may stand at a target now: the original, or our replacement of an installation
    whose other target was reloaded (stale); either gives way to the new replacement."""
    return [resolved.held, *([resolved.installed] if resolved.installed is not None else [])]


def _unlike_any_version(*args: object, **kwargs: object) -> None:
    raise AssertionError("a stand-in for a target unlike any version: never called")


class FunctionKind(BaseKind[ResolvedTarget]):
    """Functions and methods: found in the module (or class) that defines them."""

    name = "function"
    # A method of a class whose constructor the entry replaced runs the original for the
    # objects built before that (the constructor kind turns it off for itself).
    routes_old_objects = True

    def found_in(
        self, module: ModuleType, target: Target, backport_id: str
    ) -> ResolvedTarget | None:
        return find_in(module, target, backport_id)

    def refusal(self, target: Target, resolved: ResolvedTarget, reads: Sequence[str]) -> str | None:
        if resolved.foreign is not None:
            # Patching over it would silently drop that patch (and the sniff would run it).
            return f"{resolved.module_name}.{target.attribute} is {resolved.foreign}"
        # The undecorated body's signature: a compiled wrapper takes ``*args``.
        actual = tuple(inspect.signature(resolved.body).parameters)
        if actual != target.parameters:
            return (
                f"{resolved.module_name}.{target.attribute} signature is ({', '.join(actual)}), "
                f"expected ({', '.join(target.parameters)})"
            )
        return lacking(resolved.module, target, reads)

    def fingerprint(self, target: Target, resolved: ResolvedTarget) -> dict[str, object] | None:
        if resolved.foreign is not None or resolved.installed is not None:
            return None
        source = getattr(resolved.module, "__file__", None)
        installed = installed_file(target.distribution, resolved.module_name, source)
        if installed is None:
            return None
        return {
            "module": resolved.module_name,
            "imported_as": resolved.imported_as,
            "file": installed["file"],
            "file_sha256": installed["file_sha256"],
            # As loaded: an in-memory replacement compiled under the module's file name too.
            "code_sha256": _code_sha256(resolved.original),
            "distribution": installed["distribution"],
        }

    def replacement(self, target: Target, vendored_module: ModuleType) -> object:
        return callable_replacement(target, vendored_module)

    def stand_in(
        self, target: Target, resolved: ResolvedTarget, replacement: object
    ) -> ResolvedTarget:
        function = cast(Callable[..., object], replacement)  # what ``replacement()`` gave
        return replace(resolved, original=function, installed=None, foreign=None, decorated=False)

    def aliases(self, resolved: ResolvedTarget) -> list[object]:
        # A method's one site is its class: no module aliases.
        return [] if resolved.is_method else _olds(resolved)

    def install(
        self,
        backport_id: str,
        target: Target,
        resolved: ResolvedTarget,
        replacement: object,
        markers: Mapping[str, object],
        aliases: dict[int, list[Site]],
    ) -> Part:
        made = _made(resolved, target, replacement, backport_id, markers)
        if (
            self.routes_old_objects
            and resolved.is_method
            and isinstance(resolved.held, types.FunctionType)
        ):
            # The entry replaced this class's constructor: objects built before that keep
            # the original method too (it may read what only the new constructor sets).
            before = built_before(backport_id, resolved.owner)
            if before is not None:
                made = routed(cast(Callable[..., object], made), resolved.held, before)
        olds = _olds(resolved)
        bound = vars(resolved.owner).get(resolved.name)
        if not any(bound is old for old in olds):
            raise LookupError(f"{resolved.module_name}.{target.attribute} is not the original")
        defining: Site = (resolved.module_name, resolved.attribute)
        if resolved.is_method:
            # A class attribute: set on the class that defines it only.
            setattr(resolved.owner, resolved.name, made)
            return Part(self, backport_id, target, resolved, made, (defining,))
        sites = rebind_everywhere(defining, olds, made, aliases)
        return Part(self, backport_id, target, resolved, made, sites)

    def uninstall(self, part: Part) -> None:
        resolved = self.record_of(part)
        if not resolved.is_method:
            defining = (resolved.module_name, resolved.name)
            restore_everywhere(part.sites, part.replacement, resolved.held, defining)
        # The object patched at install time, even when ``sys.modules`` now holds a fresh
        # import under its name (code that kept a reference still calls into it).
        owner = resolved.owner
        namespace = vars(owner) if resolved.is_method else live_namespace(owner)
        if namespace is not None and namespace.get(resolved.name) is part.replacement:
            setattr(owner, resolved.name, resolved.held)

    def is_live(self, part: Part) -> bool:
        """In the module object ``sys.modules`` holds now (a reload re-executes the module
        and rebinds the original; a fresh import makes a new module object)."""
        resolved = self.record_of(part)
        module = sys.modules.get(resolved.module_name)
        if module is not resolved.module:
            return False
        try:
            owner_name = resolved.attribute.rpartition(".")[0]
            if resolved.is_method and getattr(module, owner_name, None) is not resolved.owner:
                return False
            return vars(resolved.owner).get(resolved.name) is part.replacement
        except Exception:
            return False

    def bound(self, resolved: ResolvedTarget) -> object:
        return vars(resolved.owner).get(resolved.name)

    def evidence(self, target: Target, resolved: ResolvedTarget) -> dict[str, object]:
        return {
            "module": resolved.module_name,
            "imported_as": resolved.imported_as,
            "attribute": target.attribute,
            "installed": resolved.installed is not None,
            "decorated": resolved.decorated,
        }

    def after_install(self, parts: Sequence[Part]) -> tuple[str, dict[str, object]]:
        """torch.compile's code compiled before a method was replaced may have inlined the
        original: it is dropped (it recompiles with the backport) and named."""
        from ._compiled_code import drop_stale

        try:
            dropped = drop_stale(self.record_of(p).is_method for p in parts)
        except Exception as exc:  # torch internals moved: say so, never fail the install
            _LOG.warning("cannot check torch.compile's earlier code: %r", exc)
            return "", {}
        if not dropped:
            return "", {}
        extra = f" and {len(dropped) - 3} more" if len(dropped) > 3 else ""
        note = (
            f" [torch.compile had compiled {', '.join(dropped[:3])}{extra} before the install: "
            "that code was dropped and recompiles with the backport; call apply() before "
            "torch.compile]"
        )
        return note, {"compiled_before_apply": dropped}

    @contextlib.contextmanager
    def unlike_any_version(self, target: Target, resolved: ResolvedTarget) -> Iterator[bool]:
        held = vars(resolved.owner)[resolved.name]
        setattr(resolved.owner, resolved.name, _unlike_any_version)
        try:
            yield True
        finally:
            setattr(resolved.owner, resolved.name, held)


def _code_sha256(function: Callable[..., object]) -> str:
    return hashlib.sha256(marshal.dumps(function.__code__)).hexdigest()


KIND = FunctionKind()
