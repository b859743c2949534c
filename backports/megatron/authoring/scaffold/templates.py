"""The texts ``backports new`` writes (``str.format`` templates: ``{{`` is a literal brace).

Kept apart from ``scaffold.py`` so that the logic fits on a screen; ``values`` computes
every placeholder from a ``Scaffold``.
"""

from .model import Scaffold

_INDENT = " " * 12  # the keyword arguments of Target(...) in ENTRY


def _since(since: str | None) -> str:
    """``--since``, as given; "0" without it. Never the installed version: a target that an
    older release has too (with the same bug) would then read ``absent`` there."""
    return since or "0"


def _tuple(names: tuple[str, ...]) -> str:
    """A tuple of strings as ruff formats one: double quotes, a trailing comma for one."""
    quoted = [f'"{name}"' for name in names]
    return f"({quoted[0]},)" if len(quoted) == 1 else f"({', '.join(quoted)})"


def _comment_list(names: tuple[str, ...]) -> str:
    return "\n".join(f"#   {name}" for name in names) or "#   (none imported now)"


def values(s: Scaffold) -> dict[str, str]:
    t = s.target
    reads = "".join(f'    "{name}",\n' for name in t.reads)
    return {
        "id": s.id,
        "pr": str(s.pr),
        "repo": s.repo,
        "repo_name": s.repo.removesuffix(".git").removeprefix("https://github.com/"),
        "dist": s.distribution,
        "package": s.package_name,
        "folder": s.folder,
        "vendored_module": s.vendored_module,
        "target_module": t.module,
        "source_path": t.source_path,
        "modules": _tuple(t.modules),
        "attribute": t.attribute,
        "name": t.name,
        "parameters": _tuple(t.parameters),
        "helpers": _tuple(t.reads),
        "decorator": "None" if t.decorator is None else f'"{t.decorator}"',
        "decorator_note": (
            "# torch.compile'd: its `@` line names this decorator (check it); the\n"
            f"{_INDENT}# vendored body is decorated with the live one at install.\n"
            f"{_INDENT}"
            if t.decorator
            else ""
        ),
        "target_distribution": t.distribution,
        "target_since": _since(s.since),
        "target_since_note": (
            "# The first release that has the target at all (backports new --since)."
            if s.since
            else "# The first release that has the target at all: 0 until you know it (the\n"
            "    # probe then finds the target or says absent, and the sniff decides)."
        ),
        "installed": f"{t.distribution} {t.version}",
        "holders": _comment_list(t.holders),
        "header": t.header,
        "reads": reads,
        "is_method": repr("." in t.attribute),
    }


PYPROJECT = """\
[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.1.0"
description = "{repo_name}#{pr} for {target_distribution}, a megatron-backports plugin"
requires-python = ">=3.12"
dependencies = ["megatron-backports", "{target_distribution}"]

# megatron-backports finds the catalog entry here: status, apply, revert, audit, check
# and the start-up hook treat it like a builtin. MEGATRON_BACKPORTS_SKIP_PLUGINS={dist}
# turns it off without importing it.
[project.entry-points.megatron_backports]
"{id}" = "{package}.entry:SPEC"

[project.optional-dependencies]
test = ["pytest>=8"]

[tool.setuptools.packages.find]
include = ["{package}*"]

[tool.setuptools.package-data]
"*" = ["UPSTREAM.toml"]

[tool.pytest.ini_options]
testpaths = ["tests"]
"""

README = """\
# {dist}

Carries {repo_name}#{pr} on {installed} until a release has it, as a
megatron-backports plugin: `{target_module}.{attribute}`
is replaced by `{package}/vendor/{folder}/{vendored_module}.py` wherever the installed
code lacks the fix, and `backports check` turns red the day it lands.

Scaffolded by `backports new`. The tests fail until you write:

1. the sniff in `{package}/entry.py` (`_observe` and `_is_fixed`): call the function on tiny
   inputs that show the bug, and say which observation means the fix is there;
2. the replacement in `{package}/vendor/{folder}/{vendored_module}.py`: the pull request's
   behaviour, nothing more (what you add on top belongs outside `vendor/`);
3. `head_sha` (and `merge_sha` once merged) in `UPSTREAM.toml`.

Then install it, so that its sniff can run here, and record the vendored file's hashes with
`backports sync` (installed with megatron-backports; a sync from the pull request replaces
the vendored function or method with upstream's text, sniffs it in a child interpreter, and
refuses a commit whose code does not show the fix, or a plugin not installed yet):

    pip install -e .      # or build a wheel
    backports sync --vendor-dir {package}/vendor --backport {id} --rehash
    backports sync --vendor-dir {package}/vendor --backport {id} --pr {pr}
    backports sync --vendor-dir {package}/vendor --check

and check it:

    python -m pytest
    backports status      # {id}: needed, source {dist} 0.1.0
    backports check       # exit 0; exit 1 once it landed upstream or no longer fits

Delete this distribution once the release you run carries the fix (`backports check`
says `upstream`).
"""

PACKAGE_INIT = '''\
"""Backport of {repo_name}#{pr}, carried with megatron-backports (see entry.py)."""
'''

VENDOR_INIT = '''\
"""Vendored upstream code, one folder per backport (each with its UPSTREAM.toml)."""
'''

VENDORED_INIT = '''\
"""{repo_name}#{pr}: the vendored replacement for {target_module}.{attribute}."""
'''

VENDORED = '''\
# Vendored for megatron-backports; see UPSTREAM.toml beside this file.
# repo:   {repo}
# pr:     {pr}
# path:   {source_path}
# symbol: {attribute}
# origin: a stub written by `backports new`: write the pull request's behaviour here.
"""{repo_name}#{pr}: ``{attribute}`` with the fix.

Upstream's behaviour and nothing else. The names in ``__reads__`` are read from the live
target module at call time (``_live_target().NAME``), so a helper replaced there is seen.
"""

from __future__ import annotations

import sys

# The module whose globals the function reads; the applier rebinds it to the module that
# really defines the target.
__target_module__ = "{target_module}"

# Module globals of the target that the installed function reads (from its code): the
# ones your replacement reads too belong in Target.helpers in entry.py.
__reads__ = (
{reads})


def _live_target():
    return sys.modules[__target_module__]


{header}
    raise NotImplementedError("{id}: write the fixed {attribute} here (see README.md)")
'''

ENTRY = '''\
"""{repo_name}#{pr}: the catalog entry for {target_module}.{attribute}.

Registered under the entry point group ``megatron_backports`` in pyproject.toml.
Scaffolded by ``backports new`` from {installed}.
"""

import inspect
from collections.abc import Sequence
from typing import Any

from packaging.version import Version

from backports.megatron.catalog import BackportSpec, SniffResult, Target, VendoredRef

__all__ = ["SPEC"]

# Modules that held the target by name when this was scaffolded; the patcher rebinds
# every such alias on install and restores it on revert:
{holders}


def _observe(function: Any) -> dict[str, Any]:
    """Call ``function`` on tiny inputs that show the bug; return what happened (JSON-able).

    It runs on the installed original (through the sniff) and on the vendored replacement
    (tests/). Never write the live module: for a private copy of the function that sees
    stand-ins for module globals, use backports.megatron.private_globals.with_globals.
    """
    raise NotImplementedError("{id}: call the function on inputs that show the bug")


def _is_fixed(seen: dict[str, Any]) -> bool:
    """Whether what ``_observe`` saw is the fixed behaviour."""
    raise NotImplementedError("{id}: say which observation means the fix is present")


def _sniff(targets: Sequence[Any]) -> SniffResult:
    """Fixed or not, from behaviour; raising makes the backport ``incompatible``."""
    seen = _observe(inspect.unwrap(targets[0].original))
    fixed = _is_fixed(seen)
    summary = f"{attribute} {{'behaves' if fixed else 'does not behave'}} as {repo_name}#{pr}"
    return SniffResult(fixed, summary, {{"seen": seen}})


SPEC = BackportSpec(
    id="{id}",
    title="{repo_name}#{pr}: {attribute}",
    targets=(
        Target(
            distribution="{target_distribution}",
            modules={modules},
            attribute="{attribute}",
            parameters={parameters},
            # Module globals your replacement reads from the live module (these are the
            # ones the installed function reads; keep those the replacement needs).
            helpers={helpers},
            {decorator_note}decorator={decorator},
        ),
    ),
    {target_since_note}
    target_since=Version("{target_since}"),
    # The first release that carries the fix; None while none does.
    fixed_in=None,
    sniff=_sniff,
    vendored=VendoredRef(
        package="{package}.vendor.{folder}",
        module="{vendored_module}",
        attribute="{name}",
    ),
    delete_when_landed=(
        "Uninstall {dist} (pip uninstall {dist}) "
        "and remove it from the job's requirements: "
        "the installed {target_distribution} has {repo_name}#{pr}."
    ),
)
'''

TESTS = '''\
"""{id}: the sniff and the replacement, on the installed {target_distribution}.

Scaffolded by ``backports new``: these fail until entry.py's sniff and the vendored
replacement are written (a scaffold that passes proves nothing).
"""

import importlib
import tomllib
from importlib.resources import files

import pytest

from backports.megatron import applied, catalog, cli, revert, status
from backports.megatron.vendored import load_replacement

from {package}.entry import SPEC, _is_fixed, _observe

ID = "{id}"
MODULE = "{target_module}"
ATTRIBUTE = "{attribute}"


@pytest.fixture(autouse=True)
def _the_original_whether_or_not_the_hook_is_there():
    """Where `backports apply` left its start-up hook, importing the target installed the
    backport already: each test starts (and ends) with the original in place."""
    importlib.import_module(MODULE)
    revert(ID)
    yield
    revert(ID)


def _bound():
    """The object bound at the target now (the class dict's own for a method)."""
    module = importlib.import_module(MODULE)
    owner, _, name = ATTRIBUTE.rpartition(".")
    return vars(getattr(module, owner))[name] if owner else getattr(module, name)


def test_the_entry_point_registers_it():
    assert catalog.by_id(ID) == SPEC
    assert catalog.source(ID).startswith("{dist} ")


def test_upstream_toml_names_the_pull_requests_head():
    data = tomllib.loads((files(SPEC.vendored.package) / "UPSTREAM.toml").read_text())
    if data.get("head_unknown"):  # derived from a plain clone: its squash merge names the fix
        assert len(data.get("merge_sha", "")) == 40, "set merge_sha in UPSTREAM.toml"
    else:
        assert data["head_sha"] != "0" * 40, "set head_sha (and merge_sha) in UPSTREAM.toml"


def test_the_installed_target_lacks_the_fix():
    (report,) = status(ID)
    assert str(report.verdict) == "needed", report.reason


def test_the_replacement_has_the_fix():
    importlib.import_module(MODULE)
    replacement = load_replacement(SPEC.vendored, MODULE)
    assert _is_fixed(_observe(replacement))


def test_apply_installs_it_and_revert_restores_the_original():
    original = _bound()
    with applied(ID) as reports:
        assert [str(r.action) for r in reports] == ["installed"], reports[0].reason
        assert getattr(_bound(), "__backport__", None) == ID
    assert _bound() is original


def test_backports_check_passes():
    assert cli.main(["check", "--only", ID]) == 0


def test_the_contract_every_entry_passes():
    """backports.megatron.testing's checks, the ones every builtin passes too."""
    from backports.megatron.testing import CONTRACT

    for check in CONTRACT:
        check(SPEC)
'''
