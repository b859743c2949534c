"""``backports new`` (backports/megatron/authoring/scaffold/) on real megatron-core 0.19.2 targets.

What the scaffold reads is compared with what the tests know of megatron-core 0.19.2 by
hand (``divide(numerator, denominator)`` and the modules that import it by name;
``TopKRouter._apply_expert_bias`` compiled through ``megatron.core.jit.jit_fuser``). The
install, the generated tests failing untouched, and a filled-in plugin are
tests/authoring/test_plugin_install.py's (slow: a throwaway venv).
"""

import ast
import hashlib
import importlib
import json
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from backports.megatron import (
    Action,
    BackportWarning,
    Verdict,
    apply,
    catalog,
    cli,
    revert,
)
from backports.megatron.authoring.scaffold import read_target
from backports.megatron.catalog import BackportSpec
from backports.megatron.job import deferred
from backports.megatron.kinds.install import installed
from backports.megatron.model import WITH_LOCAL_CHANGES
from backports.megatron.vendored.manifest import manifest_problems
from tests.authoring.test_plugin_install import OBSERVE
from tests.paths import ROOT
from tests.vendored.test_vendored import documented_digest

DIVIDE = "megatron.core.utils:divide"
EXPERT_BIAS = "megatron.core.transformer.moe.router:TopKRouter._apply_expert_bias"
# The builtin prefix, allowed: the generated names below follow from the id.
ARGS = ["--id", "megatron-lm-9999", "--pr", "9999", "--repo", "https://github.com/o/r.git",
        "--allow-builtin-prefix"]  # fmt: skip
PACKAGE = "megatron_lm_9999_backport"


def new(dest: Path, target: str = DIVIDE, *extra: str) -> int:
    return cli.main(["new", *ARGS, "--target", target, "--dest", str(dest), *extra])


def test_new_writes_an_installable_plugin_for_a_plain_function(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "plugin"
    assert new(dest, DIVIDE, "--sha", "abc1234" + "0" * 33) == 0
    vendor = f"{PACKAGE}/vendor/megatron_lm_9999"
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == sorted(
        [
            "README.md",
            "pyproject.toml",
            f"{PACKAGE}/__init__.py",
            f"{PACKAGE}/entry.py",
            f"{PACKAGE}/vendor/__init__.py",
            f"{vendor}/__init__.py",
            f"{vendor}/utils.py",
            f"{vendor}/UPSTREAM.toml",
            "tests/test_megatron_lm_9999.py",
        ]
    )
    project = tomllib.loads((dest / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["megatron_backports"] == {
        "megatron-lm-9999": f"{PACKAGE}.entry:SPEC"
    }
    assert project["project"]["name"] == "megatron-lm-9999-backport"
    folder = dest / vendor
    upstream = tomllib.loads((folder / "UPSTREAM.toml").read_text())
    assert manifest_problems(upstream) == []
    assert upstream["sha256"] == hashlib.sha256((folder / "utils.py").read_bytes()).hexdigest()
    assert upstream["files_sha256"] == documented_digest(folder)
    assert (upstream["path"], upstream["symbol"], upstream["head_sha"]) == (
        "megatron/core/utils.py",
        "divide",
        "abc1234" + "0" * 33,
    )
    out = capsys.readouterr().out
    # megatron-core 0.19.2 imports divide by name into these (each a `from ... import divide`).
    for holder in ("megatron.core.tensor_parallel.utils", "megatron.core.tensor_parallel.layers"):
        assert holder in out
    assert "divide(numerator, denominator) from megatron-core 0.19.2" in out


def _spec_call(entry: Path) -> dict[str, ast.expr]:
    """The keyword arguments of Target(...) in the generated entry module."""
    tree = ast.parse(entry.read_text())
    (call,) = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Target"
    ]
    return {kw.arg: kw.value for kw in call.keywords if kw.arg}


def test_the_entry_describes_what_the_installed_target_is(tmp_path: Path) -> None:
    assert new(tmp_path / "p", DIVIDE) == 0
    target = _spec_call(tmp_path / "p" / PACKAGE / "entry.py")
    assert ast.literal_eval(target["modules"]) == ("megatron.core.utils",)
    assert ast.literal_eval(target["attribute"]) == "divide"
    assert ast.literal_eval(target["parameters"]) == ("numerator", "denominator")
    assert ast.literal_eval(target["helpers"]) == ("ensure_divisibility",)
    assert ast.literal_eval(target["decorator"]) is None
    stub = (tmp_path / "p" / PACKAGE / "vendor" / "megatron_lm_9999" / "utils.py").read_text()
    assert "def divide(numerator, denominator):\n    raise NotImplementedError" in stub


def _target_since(entry: Path) -> str:
    tree = ast.parse(entry.read_text())
    (call,) = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "BackportSpec"
    ]
    (since,) = [kw.value for kw in call.keywords if kw.arg == "target_since"]
    assert isinstance(since, ast.Call)
    return str(ast.literal_eval(since.args[0]))


def test_target_since_is_asked_for_never_read_from_the_installed_version(tmp_path: Path) -> None:
    # From 0.19.2 it would say 0.19, and `audit` of a 0.18 that has the target (with the
    # same bug) would call it absent. Without --since: 0, the probe and the sniff decide.
    assert new(tmp_path / "a", DIVIDE) == 0
    assert _target_since(tmp_path / "a" / PACKAGE / "entry.py") == "0"
    assert new(tmp_path / "b", DIVIDE, "--since", "0.15") == 0
    assert _target_since(tmp_path / "b" / PACKAGE / "entry.py") == "0.15"


def test_since_must_be_a_version(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        new(tmp_path / "c", DIVIDE, "--since", "soon")
    assert exit_.value.code == 2 and "not a version: 'soon'" in capsys.readouterr().err


def test_a_compiled_method_gets_its_decorator_and_self(tmp_path: Path) -> None:
    info = read_target(EXPERT_BIAS)
    assert info.module == "megatron.core.transformer.moe.router"
    assert info.attribute == "TopKRouter._apply_expert_bias"
    assert info.parameters == ("self", "routing_map", "padding_mask")  # of the body
    assert info.decorator == "megatron.core.jit:jit_fuser"  # from the @ line and the import
    assert new(tmp_path / "p", EXPERT_BIAS) == 0
    target = _spec_call(tmp_path / "p" / PACKAGE / "entry.py")
    assert ast.literal_eval(target["decorator"]) == "megatron.core.jit:jit_fuser"
    stub = (tmp_path / "p" / PACKAGE / "vendor" / "megatron_lm_9999" / "router.py").read_text()
    compile(stub, "router.py", "exec")
    assert "def _apply_expert_bias(self, routing_map" in stub


def test_new_refuses_an_existing_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "plugin"
    dest.mkdir()
    (dest / "mine.txt").write_text("keep")
    assert new(dest) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists" in err and str(dest) in err
    assert [p.name for p in dest.iterdir()] == ["mine.txt"]


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("megatron.core.no_such_module:f", "cannot import megatron.core.no_such_module"),
        ("megatron.core.utils:no_such_function", "has no no_such_function"),
        ("megatron.core.utils", "MODULE:QUALNAME"),
        ("megatron.core.transformer.moe.router:TopKRouter.nope", "not defined on that class"),
    ],
)
def test_new_refuses_a_target_it_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, says: str
) -> None:
    assert new(tmp_path / "plugin", target) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err
    assert list(tmp_path.iterdir()) == []  # nothing half-written


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--sha", "xyz"], "--sha"),
        (["--sha", "abc"], "--sha must be 4 to 40 hex digits"),  # sync's rule (SHA_RULE)
        (["--package", "not-a-name"], "--package"),
        (["--package", 'x"\nimport os'], "--package"),
        (["--package", "x{id}"], "--package"),
        (["--package", "x\\y"], "--package"),
        (["--package", "class"], "--package"),  # a keyword: the test it writes would not parse
    ],
)
def test_new_refuses_bad_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], says: str
) -> None:
    assert new(tmp_path / "plugin", DIVIDE, *extra) == 2
    assert says in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_new_help_shows_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["new", "--help"])
    out = capsys.readouterr().out
    assert "example:" in out and "backports new --id acme-9999 --pr 9999" in out
    assert "--target megatron.core.utils:divide" in out


@pytest.mark.parametrize("backport_id", ["megatron-lm-7617", "megatron-lm-12345"])
def test_an_id_with_the_builtin_prefix_is_refused_unless_allowed(
    tmp_path, capsys, backport_id
) -> None:
    """A plugin under a builtin's id would be withheld at load; under the prefix, it needs
    the user's leave (MEGATRON_BACKPORTS_ALLOW_BUILTIN_IDS)."""
    args = ["new", "--id", backport_id, "--pr", "9999", "--repo", "https://github.com/o/r.git",
            "--target", "megatron.core.utils:divide", "--dest", str(tmp_path / "p")]  # fmt: skip
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "megatron-lm-" in err and "--allow-builtin-prefix" in err
    assert not (tmp_path / "p").exists()
    if backport_id == "megatron-lm-7617":  # a builtin's own id: refused even when allowed
        assert cli.main([*args, "--allow-builtin-prefix"]) == 2
    else:
        assert cli.main([*args, "--allow-builtin-prefix"]) == 0


@pytest.mark.parametrize(
    "repo",
    [
        'https://x/r.git"\nimport os\nos.system("true")\n#',  # ends a string, then code
        "https://x/r.git\nimport os",  # a newline ends the vendored file's comment
        "https://x/r.git\\",  # a backslash escapes the closing quote
        "https://x/{id}/r.git",  # a format field
        "https://x/'r'.git",
        "   ",
    ],
)
def test_new_refuses_a_repo_that_would_escape_into_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], repo: str
) -> None:
    args = ["new", "--id", "acme-9999", "--pr", "9999", "--repo", repo]
    assert cli.main([*args, "--target", DIVIDE, "--dest", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--repo" in err
    assert list(tmp_path.iterdir()) == []


def test_an_id_that_is_no_python_name_is_blamed_on_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["new", "--id", "9999", "--pr", "9999", "--repo", "https://github.com/o/r.git"]
    assert cli.main([*args, "--target", DIVIDE, "--dest", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert "--id must be" in err and "--package" not in err


# ---- an unfinished scaffold never passes check, and is never installed (issue 27.5) ---------

UNFINISHED = "acme-9998"
UNFINISHED_PACKAGE = "acme_9998_backport"


@pytest.fixture
def scaffolded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[bool], BackportSpec]]:
    """``scaffolded(sniff_written)``: ``backports new`` output for ``divide``, registered as
    an installed plugin is (a dist-info with its entry point, on sys.path); its vendored
    function is the template's stub. With ``sniff_written`` the sniff is filled in (as
    tests/authoring/test_plugin_install.py writes it), so only the replacement is unfinished."""
    root = tmp_path / "plugin"
    catalog.reload()

    def make(sniff_written: bool) -> BackportSpec:
        argv = ["new", "--id", UNFINISHED, "--pr", "9998", "--repo", "https://github.com/o/r.git"]
        assert cli.main([*argv, "--target", DIVIDE, "--dest", str(root)]) == 0
        if sniff_written:
            entry = root / UNFINISHED_PACKAGE / "entry.py"
            text = entry.read_text()
            start, end = text.index("def _observe("), text.index("def _sniff(")
            entry.write_text(text[:start] + OBSERVE + "\n\n" + text[end:])
        info = root / "acme_9998_backport-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: acme-9998-backport\nVersion: 0.1\n"
        )
        (info / "entry_points.txt").write_text(
            f"[megatron_backports]\n{UNFINISHED} = {UNFINISHED_PACKAGE}.entry:SPEC\n"
        )
        sys.path.insert(0, str(root))
        importlib.invalidate_caches()
        catalog.reload()
        return catalog.by_id(UNFINISHED)

    yield make
    revert()  # while the plugin's entry is still in the catalog
    if str(root) in sys.path:
        sys.path.remove(str(root))
    importlib.invalidate_caches()
    catalog.reload()
    for name in [n for n in sys.modules if n.split(".")[0] == UNFINISHED_PACKAGE]:
        del sys.modules[name]


@pytest.mark.parametrize("sniff_written", [True, False], ids=["stub-replacement", "untouched"])
def test_an_unfinished_scaffold_fails_check_and_is_never_installed(
    scaffolded: Callable[[bool], BackportSpec],
    sniff_written: bool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = scaffolded(sniff_written)
    utils = importlib.import_module("megatron.core.utils")
    original = utils.divide
    with pytest.warns(BackportWarning, match="unfinished"):
        (report,) = apply(UNFINISHED)
    assert (report.verdict, report.action) == (Verdict.INCOMPATIBLE, Action.SKIPPED)
    capsys.readouterr()
    code = cli.main(["check", "--json", "--only", UNFINISHED])
    out, err = capsys.readouterr()
    (row,) = json.loads(out)
    assert code == 1 and f"check: 1 of 1 failed: {UNFINISHED}" in err
    assert (row["verdict"], row["check"]["ok"]) == ("incompatible", False)
    why = row["check"]["why"]
    assert why.startswith("unfinished, write it: ") and "\n" not in why
    if sniff_written:  # the sniff says 0.19.2 lacks the fix; the stub cannot show it
        # (a sniff that catches what the function raises: the stub is found by its text)
        assert "vendor/acme_9998 is unfinished: divide is a stub: its body only raises " in why
    else:
        assert "the entry is unfinished: its sniff raised NotImplementedError" in why
    # What the start-up hook runs at the target's import: it installs nothing either.
    deferred.watch(deferred.Watch(spec, False, WITH_LOCAL_CHANGES, None))
    deferred.on_target_import(utils)
    assert installed(UNFINISHED) is None
    assert utils.divide is original


# ---- one SHA rule for `new` and `sync` (issue 36, item 5) -----------------------------------


@pytest.fixture
def upstream_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A repository (written here) whose pull request 9999's head is the returned commit;
    the sync's cache clone under a temporary XDG_CACHE_HOME."""
    import git

    from tests.sync.upstreams import commit_files

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    repo = git.Repo.init(tmp_path / "upstream")
    base = commit_files(repo, {"megatron/core/utils.py": "X = 1\n"}, "base", None)
    head = commit_files(repo, {"megatron/core/utils.py": "X = 2\n"}, "fix", base)
    git.Reference.create(repo, "refs/pull/9999/head", head)
    return tmp_path / "upstream", head


@pytest.mark.parametrize("prefix", [7, 12, 40], ids=lambda n: f"{n}-digits")
def test_new_writes_a_unique_short_sha_out_in_full_as_sync_does(
    tmp_path: Path, upstream_repo: tuple[Path, str], prefix: int
) -> None:
    repo, head = upstream_repo
    args = ["new", "--id", "acme-9999", "--pr", "9999", "--repo", str(repo)]
    dest = tmp_path / "p"
    sha = head[:prefix].upper()  # any case, as sync takes it
    assert cli.main([*args, "--target", DIVIDE, "--sha", sha, "--dest", str(dest)]) == 0
    toml = dest / "acme_9999_backport" / "vendor" / "acme_9999" / "UPSTREAM.toml"
    assert tomllib.loads(toml.read_text())["head_sha"] == head


def test_new_refuses_a_short_sha_that_names_no_commit_of_the_pull_request(
    tmp_path: Path, upstream_repo: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    repo, head = upstream_repo
    missing = "0000000" if not head.startswith("0000000") else "1111111"
    args = ["new", "--id", "acme-9999", "--pr", "9999", "--repo", str(repo), "--sha", missing]
    assert cli.main([*args, "--target", DIVIDE, "--dest", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert f"no commit {missing} on refs/pull/9999/head of {repo}" in err and err.count("\n") == 1
    assert not (tmp_path / "p").exists()


def _first_new_block() -> list[str]:
    """The plugin guide's first ``backports new`` command, its lines joined as a shell does."""
    guide = (ROOT / "docs" / "adding-a-backport.md").read_text()
    block = guide.split("```bash\n", 1)[1].split("```", 1)[0]
    import shlex

    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[:2] == ["backports", "new"], block
    return argv[1:]


def test_the_plugin_guides_first_block_runs_verbatim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a reader pastes it: in an empty folder, no network, exit 0 (issue 36, item 3)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert cli.main(_first_new_block()) == 0, capsys.readouterr().err
    assert (tmp_path / "acme-9999-backport" / "pyproject.toml").is_file()


def _template_test(name: str) -> Callable[..., None]:
    """One test function of the plugin's tests template (``templates.TESTS``) as written
    into a plugin, defined in a namespace of this test's: the template's text is what is
    under test."""
    from types import SimpleNamespace

    from backports.megatron.authoring.scaffold import templates

    values = {
        "id": "mlm-pr-1",
        "target_distribution": "megatron-core",
        "package": "mlm_pr_1_backport",
        "target_module": "m",
        "attribute": "f",
        "dist": "mlm-pr-1-backport",
    }
    text = templates.TESTS.format(**values)
    node = next(
        n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name
    )
    namespace: dict[str, object] = {
        "tomllib": tomllib,
        "SPEC": SimpleNamespace(vendored=SimpleNamespace(package="vendored")),
    }
    exec(compile(ast.Module(body=[node], type_ignores=[]), "<template>", "exec"), namespace)
    return namespace[name]  # type: ignore[return-value]


def test_a_plugin_derived_from_a_plain_clone_passes_its_own_provenance_test(tmp_path) -> None:
    """A plain clone knows the squash merge, not the head it squashed: the plugin's
    ``UPSTREAM.toml`` says ``head_unknown`` and names the merge; its own test accepts that,
    and still fails a scaffold whose head SHA was never set."""
    test = _template_test("test_upstream_toml_names_the_pull_requests_head")
    test.__globals__["files"] = lambda package: tmp_path
    manifest = tmp_path / "UPSTREAM.toml"
    manifest.write_text(f'head_unknown = true\nmerge_sha = "{"a" * 40}"\n')
    test()
    manifest.write_text(f'head_sha = "{"0" * 40}"\n')
    with pytest.raises(AssertionError, match="set head_sha"):
        test()
