"""Step six's input: the plugin distribution, in the layout plain ``backports new`` writes
(pyproject.toml, README.md, the package with entry.py and vendor/<id>/, tests/), written
into a folder outside the destination; it moves there only once proven."""

import datetime
import hashlib
import pprint
from pathlib import Path
from typing import Any

from . import _tool, plugin_texts, standin
from .derivation import Derivation
from .report import HUMAN_TODO, report_lines
from .sniff import ROUTES

STUB = '''\
# Vendored for megatron-backports; see UPSTREAM.toml beside this file.
"""Unfinished: {why}"""


def {name}(*args, **kwargs):
    raise NotImplementedError("unfinished: the vendored code could not be derived")
'''


def _today() -> str:
    return datetime.datetime.now(datetime.UTC).date().isoformat()


def _title_doc(title: str) -> str:
    return title.replace('"""', "'''").replace("\\", "/")


def _origin_note(d: Derivation) -> str:
    assert d.pr is not None and d.vendored is not None
    merged = [t.attribute for t in d.vendored.targets if t.merged]
    pr_head = d.pr.head
    head = (
        f"head {pr_head.sha[:12]} ({'verified' if pr_head.verified else 'not verified'})"
        if pr_head is not None
        else "head not known (the clone has no refs/pull/N/head; a squash merge)"
    )
    merge = (
        f"merge {d.pr.merge.sha[:12]} ({'verified' if d.pr.merge.verified else 'NOT verified'})"
        if d.pr.merge
        else "not merged"
    )
    text = (
        f"Derived by backports new --from-pr {d.pr.number} from a clone of {d.repo_name}: "
        f"{head}, {merge}, base {d.pr.base.sha[:12]}; against {d.installed}. "
    )
    if merged:
        text += (
            f"{', '.join(merged)} drifted in the installed release: the installed text with "
            "only this pull request's hunks merged in (three-way), never the merged file "
            "(which may carry later commits). A verbatim backports sync would replace it."
        )
    else:
        text += "Upstream's text at the pull request's commit, module globals made live look-ups."
    return text


def manifest(d: Derivation, text: str, folder_digest: str) -> dict[str, Any]:
    """The UPSTREAM.toml data of the vendored folder."""
    assert d.pr is not None and d.vendored is not None and d.changes is not None
    v = d.vendored
    first = v.targets[0].located.symbol
    data: dict[str, Any] = {
        "id": d.names.id,
        "repo": d.repo_url,
        "pr": d.pr.number,
    }
    if d.pr.head is not None:
        data["head_sha"] = d.pr.head.sha
    else:  # a plain clone: the squash merge is known, the head it squashed is not
        data["head_unknown"] = True
    if d.pr.merge is not None:
        data["merge_sha"] = d.pr.merge.sha
    data.update(
        path=first.path,
        symbol=[t.upstream for t in v.targets],
        file=v.file,
        sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        origin=v.origin,
        origin_note=_origin_note(d),
    )
    others = {
        t.upstream: t.located.symbol.path
        for t in v.targets[1:]
        if t.located.symbol.path != first.path
    }
    helpers = [loc for loc in d.located if loc.symbol.qualname in v.carried]
    others.update(
        {loc.symbol.qualname: loc.symbol.path for loc in helpers if loc.symbol.path != first.path}
    )
    if others:
        data["symbol_paths"] = others
    if v.carried:
        data["carry"] = list(v.carried)
    if v.decorators:
        data["decorators"] = v.decorators
    if v.origin == "synced":
        data.update(
            synced_sha=d.pr.new.sha,
            synced_path=first.path,
            upstream_sha256=hashlib.sha256(v.segment.encode("utf-8")).hexdigest(),
            reads=list(v.reads),
        )
    if d.fixed_symbols:
        data["fixed_symbols_sha256"] = dict(d.fixed_symbols)
    if d.changes.tests:
        data["upstream_tests"] = list(d.changes.tests)
    data["files_sha256"] = folder_digest
    return data


_MANIFEST_HEAD = (
    "# Provenance of the vendored code in this folder, written by backports new --from-pr.\n"
    "# `backports sync --vendor-dir <package>/vendor --check` verifies sha256 and files_sha256.\n"
)


def _entry(d: Derivation) -> str:
    assert d.pr is not None and d.vendored is not None
    v = d.vendored
    routes = sorted({entry["route"] for entry in d.sniffs})
    has_tests = "a" in routes
    tests = "_upstream_test" if has_tests else "None"
    title_short = f"{d.repo_name}#{d.pr.number}"
    if d.sniffs and d.unfinished is None:
        code = plugin_texts.SNIFF_DONE.format(tests=tests, title_short=title_short)
    else:
        code = plugin_texts.SNIFF_UNFINISHED.format(why=d.unfinished or "no sniff derived")
    targets = "".join(
        plugin_texts.TARGET.format(
            distribution="megatron-core",
            module=t.module,
            attribute=t.attribute,
            parameters=t.parameters,
            helpers=t.helpers,
            replacement=t.replacement if t.replacement != t.attribute.rpartition(".")[2] else "",
            decorator=t.decorator,
        )
        for t in v.targets
    )
    targets += "".join(
        plugin_texts.CONSTANT.format(
            distribution="megatron-core", module=t.module, attribute=t.attribute
        )
        if t.added == "constant"
        else plugin_texts.ADDED.format(
            distribution="megatron-core",
            module=t.module,
            attribute=t.attribute,
            replacement=t.replacement,
            wrap=t.wrap,
        )
        for t in v.added  # after the targets: the first target leads (its module, its sniff)
    )
    kinds = {"constant": "ModuleAttribute", "method": "AddedAttribute"}
    kinds["class attribute"] = "AddedAttribute"
    used = sorted({kinds[t.added] for t in v.added})
    names = [*used, "BackportSpec", "SniffResult", "Target", "VendoredRef"]
    return plugin_texts.ENTRY.format(
        catalog_names=", ".join(names),
        repo_name=d.repo_name,
        pr=d.pr.number,
        title_doc=_title_doc(d.title),
        installed=d.installed,
        date=_today(),
        tests_import=", _upstream_test" if has_tests else "",
        route_text="; ".join(f"{r}: {ROUTES[r]}" for r in routes) or "none (unfinished)",
        route="+".join(routes),
        sniffs=pprint.pformat(d.sniffs, width=96, sort_dicts=False),
        sniff_code=code,
        id=d.names.id,
        title=f"{d.repo_name}#{d.pr.number}: {d.title}",
        targets=targets,
        vendored_package=d.names.vendored_package,
        vendored_module=v.file.removesuffix(".py"),
        vendored_attribute=v.targets[0].replacement,
        delete=(
            f"Uninstall {d.names.distribution} (pip uninstall {d.names.distribution}) and remove "
            f"it from the job's requirements: the installed megatron-core has "
            f"{d.repo_name}#{d.pr.number}."
        ),
    )


def _readme(d: Derivation) -> str:
    assert d.pr is not None
    state = "" if d.unfinished is None else f", UNFINISHED: {d.unfinished}"
    return plugin_texts.README.format(
        dist=d.names.distribution,
        repo_name=d.repo_name,
        pr=d.pr.number,
        title=d.title,
        installed=d.installed,
        date=_today(),
        state=state,
        report="\n".join(report_lines(d)),
        todo="\n".join(f"- {todo}" for todo in HUMAN_TODO),
        id=d.names.id,
        package=d.names.package,
        folder=d.names.folder,
    )


def _route_a_module(d: Derivation) -> str | None:
    results = d.sniffed.results.values() if d.sniffed else []
    tests = [r["test"] for r in results if r.get("route") == "a"]
    if not tests or not d.sniffs:
        return None
    head = (
        "# The pull request's own test(s), upstream's text at the pull request's commit, used\n"
        "# as this backport's sniff (route a). Written by backports new --from-pr.\n"
        "# ruff: noqa\n"
    )
    return head + "\n\n".join(test["source"] for test in tests)


def write_plugin(d: Derivation, root: Path) -> list[Path]:
    """Write the plugin under ``root`` (which must not exist); the files written."""
    assert d.pr is not None and d.vendored is not None
    n = d.names
    values = {
        "id": n.id,
        "pr": str(d.pr.number),
        "repo_name": d.repo_name,
        "dist": n.distribution,
        "package": n.package,
        "target_distribution": "megatron-core",
        "target_module": d.vendored.targets[0].module,
        "attribute": d.vendored.targets[0].attribute,
    }
    texts = _tool.scaffold_texts()
    vendor = f"{n.package}/vendor/{n.folder}"
    vendored_text = d.vendored.text
    files = {
        "pyproject.toml": texts["pyproject"].format(**values),
        "README.md": _readme(d),
        f"{n.package}/__init__.py": texts["package_init"].format(**values),
        f"{n.package}/_standin.py": Path(standin.__file__).read_text(encoding="utf-8"),
        f"{n.package}/entry.py": _entry(d),
        f"{n.package}/vendor/__init__.py": texts["vendor_init"].format(**values),
        f"{vendor}/__init__.py": texts["vendored_init"].format(**values),
        f"{vendor}/{d.vendored.file}": vendored_text,
        f"tests/test_{n.folder}.py": texts["tests"].format(**values),
    }
    route_a = _route_a_module(d)
    if route_a is not None:
        files[f"{n.package}/_upstream_test.py"] = route_a
    root.mkdir(parents=True)
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    folder = root / vendor
    data = manifest(d, vendored_text, _tool.python_files_digest(folder))
    (folder / "UPSTREAM.toml").write_text(
        _tool.render_upstream(_MANIFEST_HEAD, data), encoding="utf-8"
    )
    return sorted(p for p in root.rglob("*") if p.is_file())


def stub_text(name: str, why: str) -> str:
    return STUB.format(name=name, why=why.replace('"', "'"))
