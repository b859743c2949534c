"""``backports new``: scaffold an installable plugin distribution for one upstream fix.

What it writes (``DIR`` must not exist)::

    DIR/pyproject.toml                       the entry point under ``megatron_backports``
    DIR/README.md                            what to write next, and how to check it
    DIR/<package>/__init__.py
    DIR/<package>/entry.py                   the catalog entry: SPEC, a sniff skeleton
    DIR/<package>/vendor/__init__.py
    DIR/<package>/vendor/<id>/__init__.py    the vendored folder: a stub replacement and
    DIR/<package>/vendor/<id>/<module>.py    UPSTREAM.toml with its hashes filled in
    DIR/<package>/vendor/<id>/UPSTREAM.toml
    DIR/tests/test_<id>.py                   fail until the sniff and replacement exist

It reads the installed target to fill in what it can: the defining module, the signature
of the undecorated function, the decorator (torch.compile leaves
``_torchdynamo_orig_callable``; the name comes from the ``@`` line and the module's
imports), the module globals the function reads, and the modules that hold it by name.
The stub and the skeleton raise ``NotImplementedError``, so the generated tests fail until
the author writes the sniff and the replacement: a scaffold that passes proves nothing.
"""

import ast
import builtins
import dataclasses
import functools
import hashlib
import importlib
import importlib.metadata
import inspect
import keyword
import re
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from ...errors import BackportError
from ...evidence.versions import installed_version
from ...kinds.function import compiled_body
from ...sync.fetch import checked_sha, expand_sha
from ...vendored import UpstreamToml, python_files_digest, render_upstream
from ...vendored.manifest import unsafe_text
from . import templates as t
from .model import Scaffold, TargetInfo

__all__ = ["Scaffold", "TargetInfo", "create", "read_target"]

# A letter first: the id's folder (``vendor/<id with underscores>``) is a Python package.
_ID = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
_UNSET_SHA = "0" * 40  # schema-valid placeholder; the generated tests refuse it


# ---- reading the installed target --------------------------------------------------------


def _import(module_name: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except Exception as exc:
        raise BackportError(f"cannot import {module_name}: {type(exc).__name__}: {exc}") from exc


def _original(module: ModuleType, qualname: str) -> tuple[Any, Any]:
    """(owner, the object bound there): the module for a function, the class for a method."""
    owner_name, dot, name = qualname.rpartition(".")
    if not dot:
        if not hasattr(module, name):
            raise BackportError(f"{module.__name__} has no {name}")
        return module, getattr(module, name)
    if "." in owner_name:
        raise BackportError(f"--target takes MODULE:function or MODULE:Class.method: {qualname}")
    owner = getattr(module, owner_name, None)
    if not isinstance(owner, type):
        raise BackportError(f"{module.__name__}.{owner_name} is not a class")
    if name not in vars(owner):
        raise BackportError(f"{module.__name__}.{qualname} is not defined on that class")
    return owner, vars(owner)[name]


def _function_node(body: Any) -> ast.FunctionDef | ast.AsyncFunctionDef:
    try:
        source = textwrap.dedent(inspect.getsource(body))
    except (OSError, TypeError) as exc:
        raise BackportError(f"cannot read the source of {body!r}: {exc}") from exc
    node = ast.parse(source).body[0]
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        raise BackportError(f"{body!r} is not a function defined with def")
    return node


def _imported_names(module: ModuleType) -> dict[str, str]:
    """name -> "module:name" for each ``from X import name [as alias]`` of the module."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):
        return {}
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                found[alias.asname or alias.name] = f"{node.module}:{alias.name}"
    return found


def _decorator(node: ast.FunctionDef | ast.AsyncFunctionDef, module: ModuleType) -> str:
    """The first ``@`` decorator as "module:name" (where the module imported it from)."""
    imported = _imported_names(module)
    for expr in node.decorator_list:
        call = expr.func if isinstance(expr, ast.Call) else expr
        if isinstance(call, ast.Name):
            return imported.get(call.id, f"{module.__name__}:{call.id}")
    return f"{module.__name__}:?"  # the author must name it


def _reads(body: Any, module: ModuleType) -> tuple[str, ...]:
    """Module globals (not modules, not builtins) the function's code names."""
    names = set(body.__code__.co_names)
    for const in body.__code__.co_consts:  # nested functions and comprehensions
        if inspect.iscode(const):
            names.update(const.co_names)
    values = vars(module)
    return tuple(
        sorted(
            n
            for n in names
            if n in values and not inspect.ismodule(values[n]) and not hasattr(builtins, n)
        )
    )


def _holders(original: Any, body: Any) -> tuple[str, ...]:
    found = []
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict) and any(
            value is original or value is body for value in list(namespace.values())
        ):
            found.append(name)
    return tuple(sorted(found))


@functools.cache
def _distributions_by_top_level() -> Mapping[str, list[str]]:
    """Every installed distribution's top-level names, read once per process: it reads each
    distribution's RECORD (~1.3 s with torch and megatron installed), and ``backports new``
    is one command."""
    return importlib.metadata.packages_distributions()


def _distribution(module_name: str) -> str:
    top = module_name.partition(".")[0]
    names = _distributions_by_top_level().get(top, [])
    return names[0] if names else top


def _source_path(module: ModuleType) -> str:
    suffix = "/__init__.py" if hasattr(module, "__path__") else ".py"
    return module.__name__.replace(".", "/") + suffix


def _live_defaults(node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    """Defaults that name module globals read them from the live target module instead."""
    defaults = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
    for default in defaults:
        for name in [n for n in ast.walk(default) if isinstance(n, ast.Name)]:
            if not hasattr(builtins, name.id):
                live = ast.Call(ast.Name("_live_target", ast.Load()), [], [])
                name.id = ast.unparse(ast.Attribute(live, name.id, ast.Load()))


def _header(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    stub = ast.FunctionDef(
        name=node.name,
        args=node.args,
        body=[ast.Pass()],
        decorator_list=[],
        returns=node.returns,
        type_params=[],
    )
    _live_defaults(stub)
    text = ast.unparse(ast.fix_missing_locations(stub))
    return text.rsplit("\n", 1)[0]  # drop the placeholder body


def read_target(spec: str) -> TargetInfo:
    """Import ``MODULE:QUALNAME`` and describe it; ``BackportError`` in one line if it is not
    a function or method defined with ``def``."""
    module_name, colon, qualname = spec.partition(":")
    if not colon or not module_name or not qualname:
        raise BackportError(f"--target must be MODULE:QUALNAME, not {spec!r}")
    module = _import(module_name)
    _, original = _original(module, qualname)
    body = compiled_body(original) or inspect.unwrap(original)
    if not inspect.isfunction(body):
        raise BackportError(f"{spec} is a {type(body).__name__}, not a function")
    defining = sys.modules.get(body.__module__, module)
    node = _function_node(body)
    decorator = _decorator(node, defining) if compiled_body(original) is not None else None
    distribution = _distribution(defining.__name__)
    return TargetInfo(
        module=defining.__name__,
        modules=tuple(dict.fromkeys([defining.__name__, module_name])),
        attribute=qualname,
        parameters=tuple(inspect.signature(body).parameters),
        reads=_reads(body, defining),
        decorator=decorator,
        holders=_holders(original, body) if "." not in qualname else (),
        distribution=distribution,
        version=None if (v := installed_version(distribution).version) is None else str(v),
        header=_header(node),
        source_path=_source_path(defining),
    )


# ---- writing the distribution --------------------------------------------------------------


def _check_prefix(scaffold: Scaffold) -> None:
    """A plugin never takes a builtin's id, nor the builtin prefix unasked: the loader would
    withhold it (see plugins)."""
    from ...catalog import CATALOG
    from ...catalog._plugins import BUILTIN_PREFIX

    if scaffold.id in {spec.id for spec in CATALOG}:
        raise BackportError(
            f"--id {scaffold.id} is a builtin entry's id: a plugin under it is never loaded "
            "(--allow-builtin-prefix does not change that); give it your own id"
        )
    if scaffold.id.startswith(BUILTIN_PREFIX) and not scaffold.allow_builtin_prefix:
        raise BackportError(
            f"--id {scaffold.id}: the prefix {BUILTIN_PREFIX} is for builtin entries; use "
            f"your own (e.g. acme-{scaffold.id.removeprefix(BUILTIN_PREFIX)}), or pass "
            "--allow-builtin-prefix and set MEGATRON_BACKPORTS_ALLOW_BUILTIN_IDS=<distribution>"
        )


def _check(scaffold: Scaffold) -> None:
    """Every value lands in Python, TOML and Markdown: one that is not plainly what its flag
    names is refused (blamed on that flag), never written."""
    if not _ID.fullmatch(scaffold.id):
        raise BackportError(
            f"--id must be lowercase words joined by '-', starting with a letter "
            f"(acme-9999), not {scaffold.id!r}"
        )
    if scaffold.pr <= 0:
        raise BackportError(f"--pr must be a positive pull-request number, not {scaffold.pr}")
    if scaffold.sha is not None:
        checked_sha(scaffold.sha)  # the form; a short one is looked up in --repo later
    why = unsafe_text(scaffold.repo) if scaffold.repo.strip() else "nothing"
    if why is not None:
        raise BackportError(f"--repo {scaffold.repo!r} holds {why}: give a URL or a path")
    if scaffold.package is not None and not (
        scaffold.package.isidentifier()
        and scaffold.package.isascii()
        and not keyword.iskeyword(scaffold.package)  # `import class` does not parse
    ):
        raise BackportError(
            f"--package must be a Python name that is not a keyword, not {scaffold.package!r}"
        )
    _check_prefix(scaffold)
    if scaffold.dest.exists() or scaffold.dest.is_symlink():
        raise BackportError(f"{scaffold.dest} exists: `backports new` never overwrites")


def _files(s: Scaffold) -> dict[str, str]:
    """Relative path -> text, the vendored folder's hashes not yet filled in."""
    values = t.values(s)
    vendor = f"{s.package_name}/vendor/{s.folder}"
    return {
        "pyproject.toml": t.PYPROJECT.format(**values),
        "README.md": t.README.format(**values),
        f"{s.package_name}/__init__.py": t.PACKAGE_INIT.format(**values),
        f"{s.package_name}/entry.py": t.ENTRY.format(**values),
        f"{s.package_name}/vendor/__init__.py": t.VENDOR_INIT.format(**values),
        f"{vendor}/__init__.py": t.VENDORED_INIT.format(**values),
        f"{vendor}/{s.vendored_module}.py": t.VENDORED.format(**values),
        f"tests/test_{s.folder}.py": t.TESTS.format(**values),
    }


_UPSTREAM_TOML_HEAD = """\
# Provenance of the vendored code in this folder (megatron-backports reads it).
# After editing the vendored file, record its hashes again:
#   backports sync --vendor-dir {package}/vendor --backport {id} --rehash
"""


def _upstream_toml(s: Scaffold, folder: Path) -> str:
    """The folder's ``UPSTREAM.toml``, written by the one writer over a comment head."""
    stub = (folder / f"{s.vendored_module}.py").read_bytes()
    data: UpstreamToml = {
        "id": s.id,
        "repo": s.repo,
        "pr": s.pr,
        "head_sha": s.sha or _UNSET_SHA,
        "path": s.target.source_path,
        "symbol": s.target.attribute,
        "file": f"{s.vendored_module}.py",
        "sha256": hashlib.sha256(stub).hexdigest(),
        "origin": "handwritten",
        "origin_note": f"Scaffolded by `backports new` for {s.repo}#{s.pr}; a stub until written.",
        "files_sha256": python_files_digest(folder),
    }
    return render_upstream(_UPSTREAM_TOML_HEAD.format(package=s.package_name, id=s.id), data)


def _with_full_sha(scaffold: Scaffold) -> Scaffold:
    """A short ``--sha`` written out in full, as ``backports sync`` does (``SHA_RULE``):
    the one commit it starts with in ``--repo``, on the pull request's head."""
    sha = scaffold.sha
    if sha is None or len(sha) == 40:
        return scaffold if sha is None else dataclasses.replace(scaffold, sha=sha.lower())
    return dataclasses.replace(scaffold, sha=expand_sha(scaffold.repo, sha, scaffold.pr))


def create(scaffold: Scaffold) -> list[Path]:
    """Write the plugin distribution into ``scaffold.dest``; returns the files written.

    The folder is built beside its destination and renamed into place, so a failure
    leaves no half-written DIR behind.
    """
    _check(scaffold)
    scaffold = _with_full_sha(scaffold)
    dest = scaffold.dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.with_name(f".{dest.name}.backports-new")
    if staging.exists():
        raise BackportError(f"{staging} exists: a `backports new` was interrupted; remove it")
    try:
        for relative, text in _files(scaffold).items():
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        folder = staging / scaffold.package_name / "vendor" / scaffold.folder
        (folder / "UPSTREAM.toml").write_text(_upstream_toml(scaffold, folder), encoding="utf-8")
        staging.rename(dest)
    except BaseException:
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
        raise
    return sorted(p for p in dest.rglob("*") if p.is_file())
