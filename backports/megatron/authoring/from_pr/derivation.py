"""Everything one ``--from-pr`` run derived, step by step: what the plugin, the README and
the final report are written from."""

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .budget import Figures
from .model import Located, PullRequest
from .sniff import Sniffed
from .symbols import Changes
from .vendor import VendoredCode

_GITHUB = re.compile(r"(?:https://github\.com/|git@github\.com:)([\w.-]+/[\w.-]+?)(?:\.git)?/?$")


@dataclass(frozen=True)
class Names:
    """The plugin's names, from ``--id`` (default ``mlm-pr-<N>``)."""

    id: str

    @property
    def package(self) -> str:
        return f"{self.id.replace('-', '_')}_backport"

    @property
    def distribution(self) -> str:
        return self.package.replace("_", "-")

    @property
    def folder(self) -> str:
        return self.id.replace("-", "_")

    @property
    def vendored_package(self) -> str:
        return f"{self.package}.vendor.{self.folder}"


def repo_name(url: str) -> str:
    """``NVIDIA/Megatron-LM`` for a GitHub URL (or that name itself), else the last part
    of the URL."""
    if re.fullmatch(r"[\w.-]+/[\w.-]+", url):
        return url
    match = _GITHUB.search(url)
    if match:
        return match.group(1)
    name = Path(url.rstrip("/")).name.removesuffix(".git")
    return re.sub(r"[^\w.-]", "_", name) or "upstream"


@dataclass
class Derivation:
    names: Names
    clone: Path
    repo_url: str
    installed: str  # "megatron-core 0.19.2"
    pr: PullRequest | None = None
    title: str = ""
    changes: Changes | None = None
    located: list[Located] = field(default_factory=list)
    figures: Figures | None = None
    vendored: VendoredCode | None = None
    focus: tuple[str, ...] = ()
    sniffed: Sniffed | None = None
    sniffs: list[dict[str, Any]] = field(default_factory=list)
    # The fix's text of every carried symbol at the merge (normalised AST digests): what
    # lets ``status`` call the plugin ``upstream`` once a release's text is the fix's.
    fixed_symbols: dict[str, str] = field(default_factory=dict)
    proof: list[str] = field(default_factory=list)  # one line per check, as run
    upstream_tests: list[str] = field(default_factory=list)  # what `upstream-tests` said
    seconds: dict[str, float] = field(default_factory=dict)  # per step
    unfinished: str | None = None  # why it is not proven (with --keep-unfinished)

    @property
    def repo_name(self) -> str:
        return repo_name(self.repo_url)
