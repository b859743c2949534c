# Part of the vendored folder: imports nothing of megatron-backports and nothing of another
# vendored folder, so every folder whose fix is produced from megatron-core's own source holds
# a byte-identical copy of this file (tests/test_source_rules.py keeps the copies equal).
"""A function rebuilt from megatron-core's installed source with one named edit.

Where upstream's fix is a small change to megatron-core's own code (a keyword argument, a
mask expression, a branch), the replacement is not a copy of upstream's text: it is the
installed definition, parsed, edited by a named rule and compiled again, with the installed
module's own dict as its globals (every global it reads is looked up live, as the original's
are). A rule records the sha256 of the installed text it was written against and how many
places it edits: any other text (a later release, a local edit) is refused with
``SourceRuleRefused`` instead of being edited blindly, and the entry's sniff then says so.

The rebuilt code is registered with ``linecache`` under a name that says which rule made
it, so tracebacks and ``inspect.getsource`` (Triton reads a kernel's source through it)
show the edited text.
"""

import __future__

import ast
import hashlib
import inspect
import linecache
import os
import textwrap
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SourceRule", "SourceRuleRefused", "installed_function", "rebuild", "source_sha256"]

# The factory the edited definition is compiled in: its parameters become the rebuilt
# function's closure (a method's ``__class__`` cell for ``super()``, and new helpers).
_FACTORY = "__backport_source_rule__"
_MAX_WRAPPERS = 32  # __wrapped__ chains are short; a cycle must not hang


class SourceRuleRefused(RuntimeError):
    """The installed definition is not the one the rule was written against."""


@dataclass(frozen=True)
class SourceRule:
    """One named edit of one installed definition.

    ``edit`` changes the parsed definition in place and returns how many places it changed;
    anything but ``places`` is refused. ``keep_decorators``: the decorators in the source
    are applied again (a Triton kernel's ``autotune`` and ``jit``); otherwise they are
    dropped and whoever installs the result decorates it as the original is.
    """

    name: str
    symbol: str
    installed_sha256: str
    edit: Callable[[ast.FunctionDef], int]
    places: int
    keep_decorators: bool = False


def _same_file(a: str | None, b: str | None) -> bool:
    return bool(a and b) and os.path.realpath(str(a)) == os.path.realpath(str(b))


def installed_function(obj: Any, module: types.ModuleType) -> types.FunctionType:
    """The plain function ``module``'s source defines behind ``obj``: through a
    staticmethod, a Triton kernel object (``.fn``) and ``__wrapped__`` (a decorator's
    wrapper, or a replacement installed over it), to code compiled from the module's file."""
    module_file = getattr(module, "__file__", None)
    for _ in range(_MAX_WRAPPERS):
        if isinstance(obj, staticmethod | classmethod):
            obj = obj.__func__
        code = getattr(obj, "__code__", None)
        if isinstance(obj, types.FunctionType) and _same_file(code.co_filename, module_file):
            return obj
        inner = getattr(obj, "__wrapped__", None)
        if inner is None and not isinstance(obj, types.FunctionType):
            inner = getattr(obj, "fn", None)  # triton's Autotuner, JITFunction, interpreter
        if inner is None:
            break
        obj = inner
    raise SourceRuleRefused(f"no function defined in {module_file} behind {obj!r}")


def source_sha256(function: types.FunctionType) -> str:
    """sha256 of the function's definition as its file holds it (dedented, decorators
    included): what a rule's ``installed_sha256`` records."""
    return _sha256(_source(function))


def _sha256(source: str) -> str:
    return hashlib.sha256(textwrap.dedent(source).encode("utf-8")).hexdigest()


def _source(function: types.FunctionType) -> str:
    """The definition's lines as the file holds them (a method keeps its indentation)."""
    try:
        return inspect.getsource(function)
    except (OSError, TypeError) as exc:
        raise SourceRuleRefused(
            f"cannot read the source of {function.__qualname__}: {exc}"
        ) from exc


def _parsed(source: str) -> ast.stmt:
    """The one statement of ``source``. An indented definition (a method) is parsed inside a
    block, not dedented as text: a text dedent would change multi-line string literals."""
    if source[:1].isspace():
        block = ast.parse("if True:\n" + source).body[0]
        assert isinstance(block, ast.If)
        (statement,) = block.body
        return statement
    (statement,) = ast.parse(source).body
    return statement


def _definition(source: str, rule: SourceRule) -> ast.FunctionDef:
    definition = _parsed(source)
    if not isinstance(definition, ast.FunctionDef):
        raise SourceRuleRefused(f"{rule.symbol} is not a plain def")
    mangled = {
        node.attr if isinstance(node, ast.Attribute) else node.id
        for node in ast.walk(definition)
        if isinstance(node, ast.Attribute | ast.Name)
    }
    private = sorted(n for n in mangled if n.startswith("__") and not n.endswith("__"))
    if private:  # compiled outside its class, a private name would not be mangled
        raise SourceRuleRefused(f"{rule.symbol} uses private names {private}")
    if not rule.keep_decorators:
        definition.decorator_list = []
    return definition


def _factory_source(definition: ast.FunctionDef, closure: list[str]) -> str:
    factory = ast.FunctionDef(
        name=_FACTORY,
        args=ast.arguments(
            posonlyargs=[],
            args=[ast.arg(arg=name) for name in closure],
            kwonlyargs=[],
            kw_defaults=[],
            defaults=[],
        ),
        body=[definition, ast.Return(value=ast.Name(id=definition.name, ctx=ast.Load()))],
        decorator_list=[],
        type_params=[],
    )
    return ast.unparse(ast.fix_missing_locations(ast.Module(body=[factory], type_ignores=[])))


def rebuild(
    function: types.FunctionType, rule: SourceRule, helpers: Mapping[str, Any] | None = None
) -> Any:
    """``function`` (as ``installed_function`` finds it) edited by ``rule``: a new function
    with the same globals (the installed module's dict, read live), name and closure
    (``__class__`` for ``super()``), plus ``helpers`` as closure variables; with
    ``keep_decorators``, whatever the source's decorators make of it."""
    source = _source(function)
    actual = _sha256(source)
    if actual != rule.installed_sha256:
        raise SourceRuleRefused(
            f"{rule.symbol} in {function.__code__.co_filename} is not the text rule "
            f"{rule.name} was written against (sha256 {actual[:12]}, expected "
            f"{rule.installed_sha256[:12]})"
        )
    definition = _definition(source, rule)
    changed = rule.edit(definition)
    if changed != rule.places:
        raise SourceRuleRefused(
            f"rule {rule.name} changed {changed} places of {rule.symbol}, not {rule.places}"
        )
    freevars = function.__code__.co_freevars
    if freevars not in ((), ("__class__",)):
        raise SourceRuleRefused(f"{rule.symbol} closes over {freevars}")
    values = [cell.cell_contents for cell in function.__closure__ or ()]
    helpers = dict(helpers or {})
    text = _factory_source(definition, [*freevars, *helpers])
    filename = f"<rule {rule.name}: {rule.symbol}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    flags = function.__code__.co_flags & __future__.annotations.compiler_flag
    code = compile(text, filename, "exec", flags=flags, dont_inherit=True)
    (factory_code,) = [c for c in code.co_consts if getattr(c, "co_name", None) == _FACTORY]
    # The factory runs with the module's dict as its globals: decorators and defaults are
    # evaluated there as at the module's import, and nothing is bound in the module.
    factory = types.FunctionType(factory_code, function.__globals__, _FACTORY)
    rebuilt = factory(*values, *helpers.values())
    if isinstance(rebuilt, types.FunctionType):
        rebuilt.__qualname__ = function.__qualname__
    return rebuilt
