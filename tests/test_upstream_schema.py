"""UPSTREAM.toml's schema: several symbols for a multi-target entry; a head SHA left out only
where it is honestly unknown."""

import tomllib
from pathlib import Path

import pytest

from backports.megatron.catalog import CATALOG
from backports.megatron.upstream_schema import manifest_problems, symbols

ROOT = Path(__file__).resolve().parents[1]
VALID = {
    "id": "megatron-lm-1",
    "repo": "https://github.com/NVIDIA/Megatron-LM.git",
    "pr": 1,
    "head_sha": "abc1234",
    "path": "megatron/core/x.py",
    "symbol": "f",
    "file": "x.py",
    "sha256": "0" * 64,
    "files_sha256": "1" * 64,
    "origin": "handwritten",
}


@pytest.mark.parametrize(
    "symbol, listed",
    [
        ("f", ["f"]),
        ("TopKRouter._apply_expert_bias", ["TopKRouter._apply_expert_bias"]),
        (["checkpointed_forward", "DSAttention._get_index_share_carrier"], None),
    ],
)
def test_one_name_or_a_list_of_names(symbol, listed):
    data = {**VALID, "symbol": symbol}
    assert manifest_problems(data) == []
    assert symbols(data) == (listed or symbol)


@pytest.mark.parametrize("symbol", [[], ["f", "not a name"], "a..b", 5, ["f", 3]])
def test_anything_else_is_one_clear_reason(symbol):
    (problem,) = manifest_problems({**VALID, "symbol": symbol})
    assert problem.startswith("symbol must be a name")


def test_head_sha_may_be_left_out_only_by_a_handwritten_open_pull_request():
    without = {k: v for k, v in VALID.items() if k != "head_sha"}
    assert manifest_problems(without) == []
    for changed in ({"origin": "synced"}, {"merge_sha": "def5678"}):
        (problem,) = manifest_problems({**without, **changed})
        assert problem.startswith("head_sha is missing")


@pytest.mark.parametrize("spec", CATALOG, ids=lambda spec: spec.id)
def test_every_entrys_manifest_is_valid_and_names_its_targets(spec):
    folder = ROOT / "vendor" / spec.vendored.package.rpartition(".")[2]
    data = tomllib.loads((folder / "UPSTREAM.toml").read_text(encoding="utf-8"))
    assert manifest_problems(data) == []
    assert data["id"] == spec.id
    assert symbols(data) == [target.attribute for target in spec.targets]


def test_a_sync_refuses_several_symbols_and_rehash_takes_them(tmp_path, capsys):
    import shutil
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    import sync_upstream

    vendor = tmp_path / "vendor"
    shutil.copytree(ROOT / "vendor", vendor, ignore=shutil.ignore_patterns("__pycache__"))
    path = vendor / "megatron_lm_7091" / "UPSTREAM.toml"
    symbol = 'symbol = "_can_use_fused_sparse_indexer_target"'
    path.write_text(path.read_text().replace(symbol, 'symbol = ["f", "C.m"]'))
    args = ["--backport", "megatron-lm-7091", "--vendor-dir", str(vendor)]
    assert sync_upstream.main([*args, "--sha", "abcd123", "--repo", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "names f, C.m: a sync vendors one top-level function" in err and "--rehash" in err
    assert sync_upstream.main([*args, "--rehash"]) == 0
    assert sync_upstream.main(["--check", "--vendor-dir", str(vendor)]) == 0


def test_a_merged_handwritten_folder_may_say_its_head_is_unknown():
    without = {k: v for k, v in VALID.items() if k != "head_sha"}
    merged = {**without, "merge_sha": "def5678"}
    assert manifest_problems({**merged, "head_unknown": True}) == []
    problems = manifest_problems({**merged, "head_unknown": "yes"})
    assert [p.split(" ")[0] for p in problems] == ["head_sha", "head_unknown"]
    assert problems[1].startswith("head_unknown must be true")
    (problem,) = manifest_problems({**merged, "head_unknown": True, "origin": "synced"})
    assert problem.startswith("head_sha is missing")
