"""The texts ``--from-pr`` writes that plain ``backports new`` does not: the entry with its
frozen sniff, and the README with the derivation's report (``str.format`` templates:
``{{`` is a literal brace)."""

TARGET = """\
        Target(
            distribution={distribution!r},
            modules=({module!r},),
            attribute={attribute!r},
            parameters={parameters!r},
            helpers={helpers!r},
            replacement={replacement!r},
            decorator={decorator!r},
        ),
"""

ADDED = """\
        AddedAttribute(
            distribution={distribution!r},
            modules=({module!r},),
            attribute={attribute!r},
            replacement={replacement!r},
            wrap={wrap!r},
        ),
"""

CONSTANT = """\
        ModuleAttribute(
            distribution={distribution!r},
            modules=({module!r},),
            attribute={attribute!r},
        ),
"""

SNIFF_DONE = '''\
def _observe(function: Any) -> dict[str, Any]:
    """What ``function`` (the first target's installed original, or its replacement) does
    on the first sniffed target's frozen inputs."""
    return _standin.look(function, SNIFFS[0], with_globals, {tests})


def _is_fixed(seen: dict[str, Any]) -> bool:
    return _standin.decide(seen, SNIFFS[0])


def _sniff(targets: Sequence[Any]) -> SniffResult:
    """Fixed or not, from behaviour: every sniffed target must agree. Raising (a target that
    behaves like neither version) makes the backport ``incompatible``."""
    by_attribute = {{target.attribute: target for target in targets}}
    verdicts = {{}}
    for entry in SNIFFS:
        function = inspect.unwrap(by_attribute[entry["target"]].original)
        seen = _standin.look(function, entry, with_globals, {tests})
        verdicts[entry["target"]] = _standin.decide(seen, entry)
    if len(set(verdicts.values())) > 1:
        raise _standin.Mismatch(f"only part of the fix is there: {{verdicts}}")
    fixed = next(iter(verdicts.values()))
    names = ", ".join(verdicts)
    summary = f"{{names}} {{'behave' if fixed else 'do not behave'}} as {title_short}"
    return SniffResult(fixed, summary, {{"route": ROUTE, "verdicts": verdicts}})
'''

SNIFF_UNFINISHED = '''\
UNFINISHED = {why!r}


def _observe(function: Any) -> dict[str, Any]:
    """Not derived: see UNFINISHED. Write an observation that shows the bug on CPU."""
    raise NotImplementedError(UNFINISHED)


def _is_fixed(seen: dict[str, Any]) -> bool:
    raise NotImplementedError(UNFINISHED)


def _sniff(targets: Sequence[Any]) -> SniffResult:
    """Unfinished: raising makes the backport ``incompatible``, so ``backports check`` fails
    until a person writes the sniff."""
    seen = _observe(inspect.unwrap(targets[0].original))
    return SniffResult(_is_fixed(seen), "unfinished", {{}})
'''

ENTRY = '''\
"""{repo_name}#{pr}: {title_doc}

Derived by ``backports new --from-pr {pr}`` from {installed} on {date}; README.md lists
what was derived and what a person must still write. Registered under the entry point
group ``megatron_backports`` in pyproject.toml.
"""

import inspect
from collections.abc import Sequence
from typing import Any

from packaging.version import Version

from backports.megatron.catalog import {catalog_names}
from backports.megatron.private_globals import with_globals

from . import _standin{tests_import}

__all__ = ["SPEC"]

# TODO(person): the symptom a user of {installed} sees without the fix (the derivation
# cannot know it), the first release with the bug (bug_since) and how severe it is.
SYMPTOM = None

# How the sniff was made (README.md): {route_text}
ROUTE = {route!r}

# What the derivation froze, per target it could observe on CPU: the inputs that tell the
# installed code from the fixed code (stand-ins, recorders in private globals), the facts
# that do, and a control the two versions agree on.
SNIFFS = {sniffs}


{sniff_code}

SPEC = BackportSpec(
    id={id!r},
    title={title!r},
    targets=(
{targets}    ),
    # The first release that has the target(s) at all: 0 until a person knows it (the
    # probe then finds the target or says absent, and the sniff decides).
    target_since=Version("0"),
    # The first release that carries the fix; None while none does.
    fixed_in=None,
    sniff=_sniff,
    vendored=VendoredRef(
        package={vendored_package!r},
        module={vendored_module!r},
        attribute={vendored_attribute!r},
    ),
    delete_when_landed=(
        {delete!r}
    ),
)
'''

README = """\
# {dist}

Carries {repo_name}#{pr} ({title}) on {installed} until a release has it, as a
megatron-backports plugin. Derived by `backports new --from-pr {pr}` on {date}{state}.

## What was derived

```
{report}
```

## What a person must still write

{todo}

## Check it

    pip install .             # or build a wheel
    python -m pytest          # registered, needed, fixed, apply/revert, check, the contract
    backports status          # {id}: needed, source {dist} 0.1.0
    backports check           # exit 0; exit 1 once it landed upstream or no longer fits
    backports upstream-tests {id} --repo PATH/TO/Megatron-LM

The vendored code is in `{package}/vendor/{folder}/` with its provenance (`UPSTREAM.toml`);
`backports sync --vendor-dir {package}/vendor --check` verifies its hashes. Delete this
distribution once the release you run carries the fix (`backports check` says `upstream`).
"""
