"""Docs that run (issue 36, item 3): every shell block of README.md and docs/*.md.

A block a reader is told to run is either run by a test (here, or by the test named in
``ELSEWHERE``, which this file checks runs that very text) or carries a visible marker right
above it, ``<!-- not run by the tests: WHY -->`` (the network, a GPU, a Megatron-LM clone,
the full set-up). A new block with neither fails ``test_every_shell_block_is_run_or_marked``,
which also prints the blocks and lines that are not run.

The blocks run here run in bash, one logical line at a time, in a throwaway venv that sees
this environment's torch and megatron-core (tools/training_env.py), with HOME, the caches,
TMPDIR and the working directory in the test's temporary folder and pip kept offline: a
``backports apply`` writes its start-up hook into that venv, never into the real one.
Placeholders are filled (``/path/to/megatron-backports``: a copy of this repository; an
optional ``[--json]``: the line runs without and with it); a line whose placeholder stands
for something a test cannot have (``megatron_core-X.whl``, ``<the commit ...>``) is not run
and listed as such.
"""

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.paths import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import training_env

DOCS = ("README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")))
NOT_RUN = re.compile(r"<!-- not run by the tests: (.+?) -->")
FENCE = re.compile(r"```(bash|sh|console)\s*$")
SOURCE_PLACEHOLDER = "/path/to/megatron-backports"
# Lines whose placeholder a test cannot fill: the reason each is not run.
UNFILLABLE = {
    "megatron_core-X.whl": "a candidate wheel of another megatron-core (needs a download)",
    "<the commit": "a commit of a pull request on GitHub (needs the network)",
}


@dataclass(frozen=True)
class Block:
    doc: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    text: str  # the block's body
    not_run: str | None  # the marker's reason, if one stands right above the fence

    @property
    def key(self) -> tuple[str, str]:
        return self.doc, self.text.splitlines()[0]

    def commands(self) -> list[str]:
        """Logical lines (continuations joined), comment-only and blank lines dropped."""
        joined = self.text.replace("\\\n", " ")
        return [c for c in joined.splitlines() if c.strip() and not c.lstrip().startswith("#")]


def shell_blocks() -> list[Block]:
    blocks = []
    for doc in DOCS:
        lines = (ROOT / doc).read_text(encoding="utf-8").splitlines()
        index = 0
        while index < len(lines):
            if FENCE.fullmatch(lines[index]):
                end = lines.index("```", index + 1)
                above = NOT_RUN.search(lines[index - 1]) if index else None
                body = "\n".join(lines[index + 1 : end])
                blocks.append(Block(doc, index + 1, body, above.group(1) if above else None))
                index = end
            index += 1
    return blocks


def block(doc: str, first_line_starts: str) -> Block:
    found = [b for b in shell_blocks() if b.doc == doc and b.key[1].startswith(first_line_starts)]
    assert len(found) == 1, f"{doc}: no single block starting {first_line_starts!r}"
    return found[0]


# The blocks this file runs (doc, the start of the first line) and the test that runs each.
RUN_HERE = {
    ("README.md", "pip install /path/to/megatron-backports"): "test_install_and_use_blocks",
    ("README.md", "backports apply"): "test_install_and_use_blocks",
    ("docs/activation.md", "pip install /path/to/megatron-backports"): (
        "test_install_and_use_blocks"
    ),
    ("docs/adding-a-backport.md", "backports new --id acme-9999"): "test_the_plugin_guide",
    ("docs/adding-a-backport.md", "backports sync --vendor-dir"): "test_the_plugin_guide",
    ("docs/adding-a-backport.md", "pip install ."): "test_the_plugin_guide",
}
# Blocks other test files run verbatim; test_blocks_run_elsewhere_are_what_those_tests_run
# compares the text.
ELSEWHERE = {
    ("docs/adding-a-backport.md", "backports new --id acme-9999"): (
        "tests/authoring/test_scaffold.py::test_the_plugin_guides_first_block_runs_verbatim"
    ),
    ("docs/from-pr.md", "backports new --from-pr"): (
        "tests/authoring/test_from_pr_docs.py::test_the_walk_through_runs_from_a_pull_request_to_a_"
        "passing_check"
    ),
}


def _runner(b: Block) -> list[str]:
    return [
        where
        for table in (RUN_HERE, ELSEWHERE)
        for (doc, start), where in table.items()
        if doc == b.doc and b.key[1].startswith(start)
    ]


def _unfillable(command: str) -> str | None:
    return next((why for mark, why in UNFILLABLE.items() if mark in command), None)


def test_every_shell_block_is_run_or_marked(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = shell_blocks()
    assert {b.doc for b in blocks} >= {"README.md", "docs/activation.md"}, blocks
    unaccounted = [f"{b.doc}:{b.line}" for b in blocks if not b.not_run and not _runner(b)]
    assert not unaccounted, (
        f"shell blocks with neither a test that runs them nor a marker: {unaccounted}; run "
        "them in tests/project/test_docs_run.py or put '<!-- not run by the tests: WHY -->' above"
    )
    both = [f"{b.doc}:{b.line}" for b in blocks if b.not_run and _runner(b)]
    assert not both, f"marked not run, yet a test runs them: {both}"
    for key in [*RUN_HERE, *ELSEWHERE]:  # no stale entry: each names one block
        block(*key)
    report = [f"{b.doc}:{b.line}: {b.not_run}" for b in blocks if b.not_run]
    report += [
        f"{b.doc}:{b.line}: line {c!r}: {_unfillable(c)}"
        for b in blocks
        if _runner(b)
        for c in b.commands()
        if _unfillable(c)
    ]
    with capsys.disabled():
        print("\nshell blocks and lines of the docs not run by the tests:")
        print("\n".join(f"  {line}" for line in report))


def test_blocks_run_elsewhere_are_what_those_tests_run() -> None:
    from tests.authoring import test_from_pr_docs, test_scaffold

    first = block("docs/adding-a-backport.md", "backports new --id acme-9999")
    assert ["backports", *test_scaffold._first_new_block()] == shlex.split(first.commands()[0])
    assert len(first.commands()) == 1
    walk = block("docs/from-pr.md", "backports new --from-pr")
    assert test_from_pr_docs.walk_through() == walk.commands()


# --- running blocks ---------------------------------------------------------------------


@dataclass
class Reader:
    """A reader's shell: a venv's bin first on PATH, everything else in ``home``."""

    env: training_env.TrainingEnv
    home: Path
    source: Path | None  # what /path/to/megatron-backports means here (a copy, never ROOT)

    def variants(self, command: str) -> Iterator[str]:
        if SOURCE_PLACEHOLDER in command:
            # pip builds in the folder it installs: a copy keeps this checkout untouched.
            assert self.source is not None, f"{command!r} needs a copy of the source"
            command = command.replace(SOURCE_PLACEHOLDER, str(self.source))
        filled = command
        optional = re.search(r" \[(--[\w-]+)\]", filled)
        if optional is None:
            yield filled
            return
        yield filled.replace(optional.group(0), "")
        yield filled.replace(optional.group(0), " " + optional.group(1))

    def run(self, command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        extra = {
            "PATH": f"{self.env.root / 'bin'}:/usr/bin:/bin",
            "HOME": str(self.home),
            "TMPDIR": str(self.home),
            "XDG_CACHE_HOME": str(self.home / "cache"),
            "MEGATRON_BACKPORTS_CACHE_DIR": str(self.home / "verdict-cache"),
            "PIP_NO_INDEX": "1",
            "PIP_NO_BUILD_ISOLATION": "0",  # pip reads it inverted: build in this environment
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "COLUMNS": "200",
        }
        return subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + command],
            cwd=cwd,
            env=self.env.env(extra),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    def run_block(self, b: Block, cwd: Path) -> dict[str, str]:
        """Each runnable line of ``b``, which must exit 0; what each printed, by the line
        without its trailing comment."""
        outputs = {}
        for command in b.commands():
            if _unfillable(command):
                continue
            for variant in self.variants(command):
                done = self.run(variant, cwd)
                assert done.returncode == 0, (
                    f"{b.doc}:{b.line}: {variant!r} exited {done.returncode}\n"
                    f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
                )
                outputs[re.sub(r"\s+#\s.*", "", variant)] = done.stdout
        return outputs


def _reader(tmp_path: Path, *, install: bool) -> Reader:
    env = training_env.create(tmp_path / "venv", install=install)
    # A venv made with pip has bin/pip; this one borrows the test environment's pip.
    pip = env.root / "bin" / "pip"
    pip.write_text('#!/bin/sh\nexec "$(dirname "$0")/python" -m pip "$@"\n')
    pip.chmod(0o755)
    source = None if install else training_env._copy_source(tmp_path / "megatron-backports")
    (tmp_path / "work").mkdir()
    return Reader(env, tmp_path, source)


@pytest.mark.slow
def test_install_and_use_blocks(tmp_path: Path) -> None:
    """README's Install and job-start blocks, then docs/activation.md's, as written."""
    reader = _reader(tmp_path, install=False)
    work = tmp_path / "work"
    assert not (reader.env.root / "bin" / "backports").exists()

    reader.run_block(block("README.md", "pip install /path/to/megatron-backports"), work)
    assert (reader.env.root / "bin" / "backports").is_file()

    out = reader.run_block(block("README.md", "backports apply"), work)
    assert f"hook: wrote {reader.env.hook}" in out["backports apply"]
    assert re.search(r"megatron-lm-7617\s+\S+#7617\s+0\.19\.2\s+needed", out["backports status"])
    rows = json.loads(out["backports status --json"])
    assert "megatron-lm-7617" in {row["id"] for row in rows}
    whole = json.loads(out["backports status --format json-object"])
    assert {"schema_version", "summary", "reports"} <= set(whole)
    assert f"hook: removed {reader.env.hook}" in out["backports revert"]
    assert json.loads(out["backports check --json"])  # exit 0 already asserted
    assert "megatron-lm-7617" in out["backports --help"]

    out = reader.run_block(block("docs/activation.md", "pip install /path/to/"), work)
    assert reader.env.hook.is_file() and reader.env.hook.is_relative_to(tmp_path)
    assert str(reader.env.hook) in out["backports status"]


# What a plugin author writes in sections 2 and 3 of docs/adding-a-backport.md, for the
# guide's example target: a made-up fix where divide() raises ValueError instead of
# failing an assert when the numerator is not a multiple of the denominator.
_SNIFF_STUBS = {
    "acme_9999_backport/entry.py": {
        'raise NotImplementedError("acme-9999: call the function on inputs that show the bug")': (
            "try:\n"
            "        return {'returned': function(7, 2)}\n"
            "    except Exception as error:\n"
            "        return {'raised': type(error).__name__}"
        ),
        'raise NotImplementedError("acme-9999: say which observation means the fix is '
        'present")': "return seen.get('raised') == 'ValueError'",
    },
    "acme_9999_backport/vendor/acme_9999/utils.py": {
        'raise NotImplementedError("acme-9999: write the fixed divide here (see README.md)")': (
            "if numerator % denominator:\n"
            "        raise ValueError(f'{numerator} is not divisible by {denominator}')\n"
            "    return numerator // denominator"
        ),
    },
}


def _write_the_backport(plugin: Path) -> None:
    for name, edits in _SNIFF_STUBS.items():
        path = plugin / name
        text = path.read_text(encoding="utf-8")
        for stub, written in edits.items():
            assert stub in text, f"the scaffold's {name} lost its stub {stub!r}"
            text = text.replace(stub, written)
        path.write_text(text, encoding="utf-8")


@pytest.mark.slow
def test_the_plugin_guide(tmp_path: Path) -> None:
    """docs/adding-a-backport.md from `backports new` to a green `backports check`: the
    scaffold, the sniff and replacement a reader writes, --rehash, install, the generated
    tests, status and check (the sync from GitHub between them needs the network)."""
    reader = _reader(tmp_path, install=True)
    work = tmp_path / "work"
    guide = "docs/adding-a-backport.md"
    out = reader.run_block(block(guide, "backports new --id acme-9999"), work)
    assert "wrote acme-9999-backport" in next(iter(out.values()))
    plugin = work / "acme-9999-backport"
    _write_the_backport(plugin)

    rehash = block(guide, "backports sync --vendor-dir acme_9999_backport/vendor --backport")
    out = reader.run_block(rehash, plugin)
    assert "acme-9999: wrote UPSTREAM.toml" in next(iter(out.values()))

    out = reader.run_block(block(guide, "pip install ."), plugin)
    assert re.search(r"\d+ passed", out["python -m pytest"]), out["python -m pytest"]
    assert re.search(r"acme-9999\s+NVIDIA/Megatron-LM#9999\s+0\.19\.2\s+needed\s+would-install",
                     out["backports status"])  # fmt: skip
    assert "check: all" in out["backports check"]
