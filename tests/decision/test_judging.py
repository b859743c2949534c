"""Verdicts on real megatron-core 0.19.2 and on stand-ins for other versions of it."""

import dataclasses
import importlib.metadata
import sys
from pathlib import Path
from types import SimpleNamespace

import git
import pytest
from packaging.version import Version

from backports.megatron import Action, Verdict, status
from backports.megatron.catalog import MEGATRON_LM_7617
from backports.megatron.decision import early as probe_module
from backports.megatron.decision import judging
from backports.megatron.evidence import versions as versions_module
from backports.megatron.kinds import function as targets_module
from tests import standins
from tests.conftest import BACKPORT_ID, TILELANG_DSA
from tests.deciding import probe
from tests.reports import report_for


def _status():
    # The entry alone: these tests swap its target or helpers through monkeypatch, so no
    # stored proof serves them, and every other entry's sniffs (children) would run again.
    report = report_for(status(BACKPORT_ID), BACKPORT_ID)
    return report


def test_real_0_19_2_needs_the_backport(tilelang_dsa):
    report = _status()
    assert report.verdict is Verdict.NEEDED and report.action is Action.WOULD_INSTALL
    assert report.evidence["distribution"]["version"] == "0.19.2"
    assert report.evidence["behaviour"]["fixed"] is False
    assert report.evidence["behaviour"]["nope_topk65"]["kernel_saw"] is None
    assert report.evidence["behaviour"]["control"]["kernel_saw"]["width"] == 576
    assert report.evidence["target"]["module"] == TILELANG_DSA
    assert "declined" in report.reason


def test_status_changes_nothing(tilelang_dsa):
    before = (tilelang_dsa.fused_sparse_mla_absorbed, tilelang_dsa.SparseMLA)
    _status()
    assert (tilelang_dsa.fused_sparse_mla_absorbed, tilelang_dsa.SparseMLA) == before


def test_behaviourally_fixed_stand_in_is_upstream(tilelang_dsa, monkeypatch):
    standins.landed(monkeypatch)  # the fixed stand-in, in a release recorded as fixed
    report = _status()
    assert report.verdict is Verdict.UPSTREAM, report.reason
    assert report.action is Action.WOULD_SKIP
    assert "vendor/megatron_lm_7617" in report.reason  # says what to delete
    assert report.evidence["behaviour"]["nope_topk65"]["kernel_saw"] == {
        "width": 576,
        "topk": 128,
        "heads": 16,
    }


def test_topk_padding_alone_as_in_7522_is_still_needed(tilelang_dsa, monkeypatch):
    monkeypatch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", standins.topk_padding_only)
    assert _status().verdict is Verdict.NEEDED


def test_changed_signature_is_incompatible(tilelang_dsa, monkeypatch):
    monkeypatch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", standins.new_signature)
    report = _status()
    assert report.verdict is Verdict.INCOMPATIBLE
    assert "topk_length" in report.reason


def test_sniff_that_raises_is_incompatible(tilelang_dsa, monkeypatch):
    monkeypatch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", standins.raises)
    report = _status()
    assert report.verdict is Verdict.INCOMPATIBLE
    assert "this build is broken" in report.reason


def test_missing_helper_is_incompatible(tilelang_dsa, monkeypatch):
    monkeypatch.delattr(tilelang_dsa, "_is_supported_sparse_mla_head_count")
    report = _status()
    assert report.verdict is Verdict.INCOMPATIBLE
    assert "_is_supported_sparse_mla_head_count" in report.reason


def test_missing_target_module_is_absent(tilelang_dsa, monkeypatch):
    monkeypatch.setitem(sys.modules, TILELANG_DSA, None)
    report = _status()
    assert report.verdict is Verdict.ABSENT, report.reason


def test_missing_target_function_is_absent(tilelang_dsa, monkeypatch):
    monkeypatch.delattr(tilelang_dsa, "fused_sparse_mla_absorbed")
    assert _status().verdict is Verdict.ABSENT


@pytest.mark.parametrize("version", ["0.18.2", "0.16.1", "0.18.0rc1", "0.18.99.dev0"])
def test_release_before_0_19_is_absent_without_importing(monkeypatch, version):
    monkeypatch.setattr(versions_module.importlib.metadata, "version", lambda name: version)

    def no_import(name):
        raise AssertionError(f"probe imported {name}")

    monkeypatch.setattr(targets_module, "importlib", SimpleNamespace(import_module=no_import))
    report = _status()
    assert report.verdict is Verdict.ABSENT
    assert version in report.reason


@pytest.mark.parametrize("version", ["0.19.0rc0", "0.19.0rc1", "0.19.0.dev3", "0.19.0a1"])
def test_a_pre_release_of_the_first_release_with_the_target_is_probed(
    tilelang_dsa, monkeypatch, version
):
    """0.19.0rc0 precedes 0.19.0 by ordering, yet has the target: behaviour decides."""
    monkeypatch.setattr(versions_module.importlib.metadata, "version", lambda name: version)
    report = _status()
    assert report.verdict is Verdict.NEEDED, report.reason
    assert "behaviour" in report.evidence


@pytest.mark.parametrize(
    ("installed", "claim"),
    [
        ("0.20.0", True),
        ("0.20.1rc1", True),  # a pre-release of a later release: after the fix by number
        ("0.19.2", False),
        ("0.19.1rc1", False),  # a pre-release of an earlier release: before it
        ("0.20.0rc1", None),  # a pre-release of the fixing release may or may not carry it
        ("0.20.0.dev2", None),
    ],
)
def test_the_version_claims_the_fix_by_number_but_not_for_the_fixing_releases_pre_releases(
    installed, claim
):
    spec = dataclasses.replace(MEGATRON_LM_7617, fixed_in=Version("0.20.0"))
    assert judging._version_claim(spec, {"distribution": {"version": installed}}) is claim


def test_uninstalled_megatron_core_is_absent(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(versions_module.importlib.metadata, "version", missing)
    monkeypatch.setattr(versions_module, "_package_dir", lambda package: None)
    assert _status().verdict is Verdict.ABSENT


def test_vendored_file_with_another_hash_is_incompatible(monkeypatch):
    real = probe_module.read_upstream

    def drifted(ref):
        return {**real(ref), "sha256": "0" * 64}

    monkeypatch.setattr(probe_module, "read_upstream", drifted)
    report = _status()
    assert report.verdict is Verdict.INCOMPATIBLE
    assert "sha256" in report.reason and report.evidence["vendored"]["ok"] is False


def test_version_disagreement_is_written_into_the_reason(tilelang_dsa):
    spec = dataclasses.replace(MEGATRON_LM_7617, fixed_in=Version("0.19.0"))
    result = probe(spec)
    assert result.verdict is Verdict.NEEDED  # behaviour decides
    assert "disagrees: version 0.19.2 has the fix by number" in result.reason


def test_version_agreement_is_silent(tilelang_dsa, monkeypatch):
    monkeypatch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", standins.fixed_upstream)
    spec = dataclasses.replace(MEGATRON_LM_7617, fixed_in=Version("0.19.0"))
    result = probe(spec)
    assert result.verdict is Verdict.UPSTREAM and "disagrees" not in result.reason


def test_evidence_is_json_serialisable(tilelang_dsa):
    import json

    json.dumps(_status().to_dict())


def test_synced_reads_missing_from_the_module_are_incompatible(tilelang_dsa, monkeypatch):
    """A synced function that looks up a helper only the pull request added."""
    real = probe_module.read_upstream
    monkeypatch.setattr(
        probe_module, "read_upstream", lambda ref: {**real(ref), "reads": ["_pad_for_kernel"]}
    )
    report = _status()
    assert report.verdict is Verdict.INCOMPATIBLE
    assert "_pad_for_kernel" in report.reason


@pytest.fixture
def megatron_checkout(tmp_path, monkeypatch):
    """A Megatron-LM git checkout holding the imported megatron/core: base -> fix.

    UPSTREAM.toml's head and merge SHAs name this history's "fix" commit, so the real git
    evidence says "contains" at HEAD and "does not contain" at the base commit.
    """
    repo = git.Repo.init(tmp_path / "Megatron-LM", initial_branch="main")
    core = Path(repo.working_tree_dir) / "megatron" / "core"
    core.mkdir(parents=True)
    shas = {}
    for name, text in [
        ("package_info.py", "MAJOR = 0\nMINOR = 19\nPATCH = 2\n"),
        ("__init__.py", ""),
        ("fix.py", "FIXED = True\n"),
    ]:
        (core / name).write_text(text)
        repo.index.add([str(core / name)])
        shas[name] = repo.index.commit(name).hexsha
    real = probe_module.read_upstream

    def upstream_commits(merge, head):
        monkeypatch.setattr(
            probe_module,
            "read_upstream",
            lambda ref: {**real(ref), "merge_sha": merge, "head_sha": head},
        )

    upstream_commits(shas["fix.py"], shas["fix.py"])
    monkeypatch.setattr(versions_module, "_package_dir", lambda package: core)
    return repo, shas, upstream_commits


@pytest.mark.parametrize(
    ("at", "installed", "note"),
    [
        # Behaviour says "lacks the fix" (0.19.2), git says the checkout has the commits.
        ("head", None, "disagrees: the git checkout contains megatron-lm-7617's commits"),
        # Behaviour says "has the fix", git says the checkout predates the commits, and
        # nothing else (no recorded text of an open PR, no release) confirms it: drifted.
        ("base", "fixed_upstream", "drifted: the sniff says fixed but"),
        # Both say fixed: git ancestry is the evidence that confirms the sniff.
        ("head", "fixed_upstream", None),
        ("base", None, None),  # both say not fixed
    ],
)
def test_git_checkout_cross_check(
    tilelang_dsa, monkeypatch, megatron_checkout, at, installed, note
):
    """Behaviour decides between needed and landed; a fixed sniff is ``upstream`` only with
    git ancestry (or text, or release) agreeing; git disagreeing is written into the
    reason."""
    repo, shas, _ = megatron_checkout
    if at == "base":
        repo.git.checkout(shas["package_info.py"])
    if installed is not None:
        monkeypatch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", getattr(standins, installed))
    report = _status()
    expected = {
        None: Verdict.NEEDED,
        "head": Verdict.UPSTREAM,
        "base": Verdict.INCOMPATIBLE,
    }[at if installed is not None else None]
    assert report.verdict is expected, report.reason
    assert report.evidence["git"]["contains"] == {"merge": at == "head", "head": at == "head"}
    if note is None:
        assert "disagrees" not in report.reason
    else:
        assert note in report.reason


def test_commits_unknown_to_the_checkout_are_no_evidence(tilelang_dsa, megatron_checkout):
    """A shallow clone that lacks the SHAs says nothing either way (None, not False)."""
    _, _, upstream_commits = megatron_checkout
    upstream_commits("f77f360", "3d07347")
    report = _status()
    assert report.evidence["git"]["contains"] == {"merge": None, "head": None}
    assert report.verdict is Verdict.NEEDED and "disagrees" not in report.reason


def test_a_function_that_pads_but_returns_the_wrong_layout_is_not_fixed(tilelang_dsa, monkeypatch):
    """Reaching the kernel padded is not enough: the caller must get [sq, b, heads, 512]."""
    monkeypatch.setattr(
        tilelang_dsa, "fused_sparse_mla_absorbed", standins.pads_but_returns_kernel_layout
    )
    report = _status()
    probe_call = report.evidence["behaviour"]["nope_topk65"]
    assert probe_call["kernel_saw"] == {"width": 576, "topk": 128, "heads": 16}
    assert probe_call["returned"] == [1, 2, 16, 512]  # [b, sq, ...]: sq=2, b=1 in the sniff
    assert report.verdict is Verdict.NEEDED, report.reason


def test_an_absent_target_says_where_it_looked(tilelang_dsa, monkeypatch):
    monkeypatch.delattr(tilelang_dsa, "fused_sparse_mla_absorbed")
    report = _status()
    assert report.verdict is Verdict.ABSENT
    # One entry per candidate module: the moved path is not in 0.19.2, the old one lacks it.
    assert "megatron.core.ops.attention.dsa.kernels.tilelang_dsa (no such module)" in report.reason
    assert f"{TILELANG_DSA} (no fused_sparse_mla_absorbed)" in report.reason


def test_the_reason_says_a_padded_call_returned_the_wrong_shape(tilelang_dsa, monkeypatch):
    monkeypatch.setattr(
        tilelang_dsa, "fused_sparse_mla_absorbed", standins.pads_but_returns_kernel_layout
    )
    reason = _status().reason
    assert "unpadded" not in reason
    assert "reaches the kernel padded as" in reason and "returns [1, 2, 16, 512]" in reason


@pytest.mark.parametrize("version", ["0.17.0", "0.17.1", "0.17.9.post1"])
def test_a_release_that_predates_the_bug_is_absent_saying_so(monkeypatch, version):
    """#6682's target is in 0.17, still masking the identity format: the bug came in 0.18
    (``bug_since``). Nothing is installed and the reason says why."""
    monkeypatch.setattr(versions_module.importlib.metadata, "version", lambda name: version)
    report = report_for(status("megatron-lm-6682"), "megatron-lm-6682")
    assert report.verdict is Verdict.ABSENT
    assert f"{version} predates 0.18, the first release with the bug" in report.reason
    assert "the first release with SFTTokenizer" not in report.reason


def test_a_release_from_the_bug_on_is_judged(monkeypatch):
    real = versions_module.importlib.metadata.version
    monkeypatch.setattr(
        versions_module.importlib.metadata,
        "version",
        lambda name: "0.18.2" if name == "megatron-core" else real(name),
    )
    report = report_for(status("megatron-lm-6682"), "megatron-lm-6682")
    assert report.verdict is Verdict.NEEDED, report.reason  # the 0.19.2 code, judged


def test_a_release_with_only_part_of_the_targets_names_the_part_it_lacks(monkeypatch, tmp_path):
    """#6793 on a release with ``checkpointed_forward`` but no DSAttention: absent, naming
    the DSAttention half (read from the files on the path, nothing imported)."""
    from backports.megatron.catalog import MEGATRON_LM_6793
    from backports.megatron.decision import early

    monkeypatch.setattr(versions_module.importlib.metadata, "version", lambda name: "0.18.2")
    has = MEGATRON_LM_6793.targets[0].attribute
    monkeypatch.setattr(early, "_parts_present", lambda spec: [True, False])
    report = report_for(status(MEGATRON_LM_6793.id), MEGATRON_LM_6793.id)
    assert report.verdict is Verdict.ABSENT
    lacks = MEGATRON_LM_6793.targets[1].attribute
    assert f"0.18.2 has {has} but not {lacks}, the part of the fix that arrives in 0.19" in (
        report.reason
    )


def test_the_parts_present_are_read_from_the_source_files():
    from backports.megatron.catalog import MEGATRON_LM_6793
    from backports.megatron.decision import early

    assert early._parts_present(MEGATRON_LM_6793) == [True, True]  # 0.19.2 has both
    ghost = dataclasses.replace(MEGATRON_LM_6793.targets[1], attribute="DSAttention.no_such")
    spec = dataclasses.replace(MEGATRON_LM_6793, targets=(MEGATRON_LM_6793.targets[0], ghost))
    assert early._parts_present(spec) == [True, False]
