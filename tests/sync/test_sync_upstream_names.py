"""A class renamed upstream after the release: ``UPSTREAM.toml``'s ``upstream_names``.

Upstream's main renamed MFSDP v1's adapter ``FullyShardedDataParallelV1`` (#5865) and made
``FullyShardedDataParallel`` a function that picks a class; the catalog's targets keep
megatron-core 0.19.2's name. A sync reads each symbol under upstream's name and writes it
under the release's: the method's explicit ``super(...)`` names the release's class, the
``fixed_symbols_sha256`` record is keyed by the release's name, and the header says which
name was read. Without the mapping the sync says so in one line.

Shown on #6099's two methods (its sniff then runs on the result, in this process): a small
upstream built here with gitpython, laid out as tests/sync/test_sync_6099.py's, whose class
is renamed ``LayerWiseDistributedOptimizerV2`` beside a picker function under the old name,
as #5865 did to MFSDP v1. The code is this project's own, not upstream's.
"""

from __future__ import annotations

import io
import tomllib
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import git
import pytest

from backports.megatron.commands import sync as sync_command
from backports.megatron.evidence.fix_text import symbol_digest
from backports.megatron.vendored import ManifestError, parse_upstream
from tests.sync.test_sync_6099 import FIXED, ID, PATH
from tests.sync.upstreams import commit_files, snapshot

# Clones under a temporary cache, off $HOME; the sniff in-process (tests/sync/conftest.py).
pytestmark = pytest.mark.usefixtures("cache_home", "sniff_in_process")

RELEASE = "LayerWiseDistributedOptimizer"  # megatron-core 0.19.2's name: the catalog's
RENAMED = "LayerWiseDistributedOptimizerV2"  # this upstream's
SYMBOLS = [f"{RELEASE}.__init__", f"{RELEASE}.count_zeros"]
PICKER = f'''

def {RELEASE}(*args, **kwargs):
    """Picks the class, as #5865's function picks MFSDP v1 or v2."""
    return {RENAMED}(*args, **kwargs)
'''
RENAMED_FIXED = FIXED.replace(f"class {RELEASE}(", f"class {RENAMED}(") + PICKER
MAPPING = "\n[upstream_names]\n" + "".join(
    f'"{symbol}" = "{symbol.replace(RELEASE, RENAMED)}"\n' for symbol in SYMBOLS
)


@pytest.fixture
def upstream(tmp_path: Path) -> tuple[Path, str]:
    assert RENAMED_FIXED.count(RENAMED) == 2  # the class and the picker's call
    repo = git.Repo.init(tmp_path / "Megatron-LM")
    sha = commit_files(repo, {PATH: RENAMED_FIXED}, "Fix gradient counting (#6099)", None)
    return tmp_path / "Megatron-LM", sha


def _manifest(vendor: Path) -> Path:
    return vendor / "megatron_lm_6099" / "UPSTREAM.toml"


def _merged_at(vendor: Path, sha: str, extra: str) -> None:
    """The vendor copy's manifest with ``sha`` as the fix's merge (so the sync records
    ``fixed_symbols_sha256``) and ``extra`` appended."""
    path = _manifest(vendor)
    text = path.read_text(encoding="utf-8")
    merge = tomllib.loads(text)["merge_sha"]
    path.write_text(text.replace(merge, sha) + extra, encoding="utf-8")


def _sync(repo: Path, sha: str, vendor: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    args = ["--backport", ID, "--sha", sha, "--repo", str(repo), "--vendor-dir", str(vendor)]
    with redirect_stdout(out), redirect_stderr(err):
        code = sync_command.main(args)
    return code, out.getvalue(), err.getvalue()


def test_a_class_renamed_upstream_syncs_under_the_release_name(
    upstream: tuple[Path, str], vendor: Path
) -> None:
    repo, sha = upstream
    _merged_at(vendor, sha, MAPPING)
    code, out, err = _sync(repo, sha, vendor)
    assert code == 0, (out, err)
    # The sniff ran the vendored constructor on the installed class: its super() reached
    # ChainedOptimizer through the release's class, which the live module holds.
    assert f"{ID}: the sniff shows the fix at {sha}" in out
    text = (vendor / "megatron_lm_6099" / "layer_wise_optimizer.py").read_text()
    assert f"super(_live_target().{RELEASE}, self).__init__(" in text
    assert "\ndef layer_wise_optimizer_init(\n" in text and "\ndef count_zeros(self):" in text
    header = [line for line in text.splitlines() if RENAMED in line]
    assert header == [
        f"# read as: {RENAMED}.__init__ (upstream's name for {RELEASE}.__init__)",
        f"# read as: {RENAMED}.count_zeros (upstream's name for {RELEASE}.count_zeros)",
    ]
    written = tomllib.loads(_manifest(vendor).read_text(encoding="utf-8"))
    assert written["upstream_names"] == {s: s.replace(RELEASE, RENAMED) for s in SYMBOLS}
    # Keyed by the release's name; the digest of the text as the release names the class
    # (a method's digest leaves its class out, so the rename does not change it).
    assert written["fixed_symbols_sha256"] == {s: symbol_digest(FIXED, s) for s in SYMBOLS}


def test_without_the_mapping_the_sync_says_so_in_one_line(
    upstream: tuple[Path, str], vendor: Path
) -> None:
    repo, sha = upstream
    _merged_at(vendor, sha, "")
    kept = snapshot(vendor)
    code, out, err = _sync(repo, sha, vendor)
    assert code == 2, (out, err)
    assert snapshot(vendor) == kept
    line = err.strip().splitlines()[-1]
    assert err.count("backports sync:") == 1, err
    assert line == (
        f"backports sync: error: {PATH} at {sha[:12]} defines no top-level class {RELEASE!r} "
        f"({RELEASE} is a function there); if upstream renamed the class, give upstream's "
        f"name for {RELEASE}.__init__ in UPSTREAM.toml's upstream_names"
    )


def test_a_mapping_of_a_name_symbol_does_not_list_is_refused_in_one_line(
    upstream: tuple[Path, str], vendor: Path
) -> None:
    repo, sha = upstream
    _merged_at(vendor, sha, MAPPING + f'"{RELEASE}.step" = "{RENAMED}.step"\n')
    kept = snapshot(vendor)
    code, out, err = _sync(repo, sha, vendor)
    assert code == 2, (out, err)
    assert snapshot(vendor) == kept
    assert err.count("\n") == 1 and err.startswith("backports sync: "), err
    assert f"upstream_names maps '{RELEASE}.step', which symbol does not list (" in err


HEAD = 'id = "x"\nrepo = "r"\npr = 1\npath = "a/b.py"\nfile = "b.py"\norigin = "synced"\n'
HEAD += 'head_sha = "' + "a" * 40 + '"\nsymbol = ["C.f", "g"]\n'


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ('"C.h" = "D.h"', "upstream_names maps 'C.h', which symbol does not list (C.f, g)"),
        ('"C.f" = "f"', "upstream_names must be a table of symbol = its upstream name"),
        ('"g" = "g"', "upstream_names must be a table of symbol = its upstream name"),
    ],
)
def test_the_manifest_check_refuses_a_bad_mapping_in_one_line(table: str, says: str) -> None:
    with pytest.raises(ManifestError) as raised:
        parse_upstream(f"{HEAD}\n[upstream_names]\n{table}\n", "U.toml", hashes_required=False)
    assert says in str(raised.value) and "\n" not in str(raised.value)


def test_the_manifest_check_takes_a_mapping_of_listed_symbols() -> None:
    text = f'{HEAD}\n[upstream_names]\n"C.f" = "D.f"\n"g" = "g2"\n'
    read = parse_upstream(text, "U.toml", hashes_required=False)
    assert read["upstream_names"] == {"C.f": "D.f", "g": "g2"}
