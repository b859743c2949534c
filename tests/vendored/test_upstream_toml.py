"""UPSTREAM.toml's schema: several symbols for a multi-target entry; a head SHA left out only
where it is honestly unknown."""

import tomllib

import pytest

from backports.megatron.catalog import CATALOG
from backports.megatron.vendored.manifest import manifest_problems, symbols
from tests.paths import ROOT

VALID = {
    "id": "megatron-lm-1",
    "repo": "https://github.com/NVIDIA/Megatron-LM.git",
    "pr": 1,
    "head_sha": "abc1234" + "0" * 33,
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
    for changed in ({"origin": "synced"}, {"merge_sha": "def5678" + "0" * 33}):
        (problem,) = manifest_problems({**without, **changed})
        assert problem.startswith("head_sha is missing")


@pytest.mark.parametrize("spec", CATALOG, ids=lambda spec: spec.id)
def test_every_entrys_manifest_is_valid_and_names_its_targets(spec):
    folder = ROOT / "vendor" / spec.vendored.package.rpartition(".")[2]
    data = tomllib.loads((folder / "UPSTREAM.toml").read_text(encoding="utf-8"))
    assert manifest_problems(data) == []
    assert data["id"] == spec.id
    # A symbol carried in several distributions (an entry's copies) is listed once.
    assert symbols(data) == list(dict.fromkeys(target.attribute for target in spec.targets))


def test_rehash_takes_several_symbols(tmp_path, capsys):
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
    assert sync_upstream.main([*args, "--rehash"]) == 0
    assert sync_upstream.main(["--check", "--vendor-dir", str(vendor)]) == 0


@pytest.mark.parametrize("key", ["head_sha", "merge_sha", "synced_sha"])
@pytest.mark.parametrize("sha", ["3d07347", "3D07347181AE6D34AB7D381B586A81B39A2E6C23", "3d0734 "])
def test_a_recorded_sha_must_be_the_full_40_hex_digits(key, sha):
    [problem] = manifest_problems({**VALID, key: sha})
    assert problem.startswith(f"{key} must be a full commit SHA (40 lowercase hex digits")


def test_the_recorded_shas_of_the_builtin_backports_are_exact():
    import tomllib

    def data(folder):
        return tomllib.loads((ROOT / "vendor" / folder / "UPSTREAM.toml").read_text())

    d6114, d7617 = data("megatron_lm_6114"), data("megatron_lm_7617")
    assert d6114["head_sha"] == "957fdf54447b620335f3bc7c29866589b8c87056"
    assert d6114["merge_sha"] == "723db5a72790aefc02f5a0228e6607eef70c0533"
    assert d7617["head_sha"] == "3d07347181ae6d34ab7d381b586a81b39a2e6c23"
    assert "merge_sha" not in d7617 and "could not be verified" in d7617["origin_note"]
    for folder in ("megatron_lm_7091", "megatron_lm_6793"):
        assert "head_sha" not in data(folder) and "merge_sha" not in data(folder)
        assert "No head_sha" in data(folder)["origin_note"]


@pytest.mark.parametrize(
    "tests",
    [[], ["/abs/test_x.py"], ["../up/test_x.py"], ["tests/test_x.py::A b"], "tests/t.py"],
)
def test_upstream_tests_must_be_pytest_node_ids(tests):
    [problem] = manifest_problems({**VALID, "upstream_tests": tests})
    assert problem.startswith("upstream_tests must be a list of pytest node ids")


@pytest.mark.parametrize(
    "key, value",
    [
        ("repo", "https://x/r.git\nimport os"),
        ("repo", 'https://x/r.git"'),
        ("repo", "https://x/r.git\\"),
        ("repo", "https://x/{r}.git"),
        ("path", "megatron/core/x.py\nimport os"),
        ("path", "../x.py"),
        ("path", "/abs/x.py"),
        ("moved_path", 'x".py'),
    ],
)
def test_values_written_into_code_must_be_plain(key, value):
    [problem] = manifest_problems({**VALID, key: value})
    assert problem.startswith(f"{key} must be a ")


def test_the_writer_writes_every_value_as_a_toml_literal():
    from backports.megatron.vendored.manifest import parse_upstream, render_upstream

    note = "quotes \" and ' , a backslash \\, braces {x}, and\na newline"
    text = render_upstream("# kept\nid = 'old'\n", {**VALID, "origin_note": note})
    assert text.startswith("# kept\n")
    assert parse_upstream(text, "t")["origin_note"] == note


def test_a_merged_folder_may_say_its_head_is_unknown():
    without = {k: v for k, v in VALID.items() if k != "head_sha"}
    merged = {**without, "merge_sha": "53abe744b5e8d043a06e54cfaef44cbe23b1e2ca"}
    assert manifest_problems({**merged, "head_unknown": True}) == []
    problems = manifest_problems({**merged, "head_unknown": "yes"})
    assert [p.split(" ")[0] for p in problems] == ["head_sha", "head_unknown"]
    assert problems[1].startswith("head_unknown must be true")
    # --from-pr on a plain clone: upstream's text at a squash merge whose head is not there.
    assert manifest_problems({**merged, "head_unknown": True, "origin": "synced"}) == []
    # Not merged: nothing but the head names the change.
    (problem,) = manifest_problems({**without, "head_unknown": True, "origin": "synced"})
    assert problem.startswith("head_sha is missing")
