"""manifest(): what this process runs, for logs and checkpoint metadata."""

import json
import subprocess
import sys
import tomllib
from importlib.resources import files

import pytest

from backports.megatron import apply, manifest
from tests import standins
from tests.conftest import BACKPORT_ID

UPSTREAM = tomllib.loads(
    (files("backports.megatron._vendor.megatron_lm_7617") / "UPSTREAM.toml").read_text()
)


def _entry(data: dict) -> dict:
    assert json.loads(json.dumps(data)) == data  # JSON-serialisable, unchanged by a round trip
    return data["backports"][BACKPORT_ID]


def test_names_versions_shas_and_what_runs(tilelang_dsa):
    apply()
    data = manifest()
    assert data["megatron_core"] == "0.19.2"
    assert data["megatron_backports"]  # the installed distribution's version
    entry = _entry(data)
    assert entry["verdict"] == "needed" and entry["action"] == "installed"
    assert entry["vendored_sha256"] == UPSTREAM["sha256"]
    assert entry["upstream"] == {
        "repo": UPSTREAM["repo"],
        "pr": 7617,
        "head_sha": UPSTREAM["head_sha"],
        "merge_sha": UPSTREAM.get("merge_sha"),  # unverified for #7617: left out
    }


def test_a_skipped_backport_says_why(tilelang_dsa, monkeypatch):
    standins.landed(monkeypatch)  # the fixed stand-in, in a release recorded as fixed
    with pytest.warns(UserWarning):
        apply()
    entry = _entry(manifest())
    assert (entry["verdict"], entry["action"]) == ("upstream", "skipped")


def test_disabled(monkeypatch):
    monkeypatch.setenv("MEGATRON_BACKPORTS", "0")
    entry = _entry(manifest())
    assert (entry["verdict"], entry["action"]) == ("disabled", "skipped")


def test_without_apply_the_loaded_target_is_probed(tilelang_dsa):
    entry = _entry(manifest())
    assert (entry["verdict"], entry["action"]) == ("needed", "not-applied")


@pytest.mark.slow
def test_never_imports_megatron():
    script = (
        "import json, sys\n"
        "from backports.megatron import apply, manifest\n"
        "before = manifest()['backports']\n"
        "apply()\n"
        "after = manifest()['backports']\n"
        "assert not any(m.startswith('megatron') for m in sys.modules), 'imported megatron'\n"
        "print(json.dumps([before, after]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    before, after = json.loads(done.stdout)
    assert (before[BACKPORT_ID]["verdict"], before[BACKPORT_ID]["action"]) == (None, "not-applied")
    assert (after[BACKPORT_ID]["verdict"], after[BACKPORT_ID]["action"]) == (None, "deferred")
