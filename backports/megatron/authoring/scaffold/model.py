"""What ``backports new`` is asked for (``Scaffold``) and what it read (``TargetInfo``).

Apart from ``__init__.py`` (the logic) and ``templates.py`` (the texts), which
both read these and so import each other not at all.
"""

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TargetInfo:
    """What the installed target looks like, as the catalog entry must describe it."""

    module: str  # the defining module
    modules: tuple[str, ...]  # candidate modules for Target.modules (defining one first)
    attribute: str  # "fn" or "Class.method"
    parameters: tuple[str, ...]
    reads: tuple[str, ...]  # module globals the function reads (candidates for helpers)
    decorator: str | None  # "module:name" when the original is torch.compile's wrapper
    holders: tuple[str, ...]  # modules in sys.modules that bind it by name
    distribution: str
    version: str | None
    header: str  # "def name(params):" as the stub spells it
    source_path: str  # the defining module's path in its repository (UPSTREAM.toml path)

    @property
    def name(self) -> str:
        return self.attribute.rpartition(".")[2]

    @property
    def signature_text(self) -> str:
        return f"({', '.join(self.parameters)})"


@dataclass(frozen=True)
class Scaffold:
    """The arguments of ``backports new``, checked."""

    id: str
    pr: int
    repo: str
    dest: Path
    target: TargetInfo
    sha: str | None = None
    package: str | None = None
    since: str | None = None  # the first release with the target; None: "0", behaviour decides
    # The id may start with the builtin prefix (megatron-lm-); loading it then needs
    # MEGATRON_BACKPORTS_ALLOW_BUILTIN_IDS too. A builtin's own id is refused regardless.
    allow_builtin_prefix: bool = False

    @property
    def package_name(self) -> str:
        return self.package or f"{self.id.replace('-', '_')}_backport"

    @property
    def distribution(self) -> str:
        return self.package_name.replace("_", "-")

    @property
    def folder(self) -> str:
        return self.id.replace("-", "_")

    @property
    def vendored_module(self) -> str:
        return self.target.module.rpartition(".")[2]
