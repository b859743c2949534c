"""A plugin from ``backports new`` to a green, then red, ``backports check``, installed for real.

The plugin carries a small real fix for megatron-core 0.19.2's ``megatron.core.utils.divide``
(written here: a ValueError that names both numbers instead of an assertion, which
``python -O`` strips). It is scaffolded in a temporary folder, pip-installed offline
(``--no-deps --no-build-isolation``) into a throwaway venv that holds this repository
as a user has it (tools/training_env.py), and driven through the ``backports`` command of
that venv: status lists it with its source, apply installs it (and the start-up hook
reaches a new process), revert restores the original, check passes, then fails once the
installed vendored file is edited. The generated tests fail untouched and pass once filled.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from backports.megatron import cli
from backports.megatron.catalog import CATALOG
from tests.paths import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import training_env

pytestmark = pytest.mark.slow

ID = "acme-9999"
DIST = "acme-9999-backport"
PACKAGE = "acme_9999_backport"

REPLACEMENT = '''\
def divide(numerator, denominator):
    """Integer division that refuses a remainder with a ValueError naming both numbers."""
    if denominator == 0 or numerator % denominator:
        raise ValueError(f"{numerator} is not divisible by {denominator}")
    return numerator // denominator
'''

OBSERVE = '''\
def _observe(function: Any) -> dict[str, Any]:
    """divide(7, 2): 0.19.2 asserts; the fix raises ValueError."""
    try:
        return {"returned": function(7, 2)}
    except Exception as exc:
        return {"raised": type(exc).__name__}


def _is_fixed(seen: dict[str, Any]) -> bool:
    return seen.get("raised") == "ValueError"
'''

# In a new interpreter of the venv: what divide is, through a module that imports it by name.
PROBE_DIVIDE = """
import json
from megatron.core.tensor_parallel import utils
try:
    utils.divide(7, 2)
    raised = None
except Exception as exc:
    raised = type(exc).__name__
print(json.dumps({"backport": getattr(utils.divide, "__backport__", None), "raised": raised}))
"""


# The subject is the plugin: of the builtins, one stays on beside it (its rows say "builtin")
# and the others are turned off. Each builtin would be probed again by every command and by
# the hook in each new process (status, apply and revert cost ~13 s of CPU each with all of
# them); `backports check` still probes them all (it ignores the switch).
_ONE_BUILTIN_BESIDE_IT = {
    "MEGATRON_BACKPORTS_SKIP": ",".join(s.id for s in CATALOG if s.id != "megatron-lm-7617")
}


def _fill_in(root: Path) -> None:
    """Write the replacement and the sniff into the scaffold, as its author would."""
    stub = root / PACKAGE / "vendor" / "acme_9999" / "utils.py"
    text = stub.read_text()
    start = text.index("def divide(")
    stub.write_text(text[:start] + REPLACEMENT)
    entry = root / PACKAGE / "entry.py"
    text = entry.read_text()
    start, end = text.index("def _observe("), text.index("def _sniff(")
    entry.write_text(text[:start] + OBSERVE + "\n\n" + text[end:])
    toml = root / PACKAGE / "vendor" / "acme_9999" / "UPSTREAM.toml"
    rehash = [sys.executable, str(ROOT / "tools" / "sync_upstream.py"), "--rehash"]
    done = subprocess.run(
        [*rehash, "--vendor-dir", str(toml.parent.parent), "--backport", ID],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def _install(env: training_env.TrainingEnv, root: Path) -> None:
    done = env.run(
        [
            "python", "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
            "--no-build-isolation", "--force-reinstall", "--no-cache-dir", str(root),
        ],
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def _json(done: subprocess.CompletedProcess[str]) -> dict[str, dict[str, object]]:
    assert done.returncode in (0, 1), done.stderr
    return {r["id"]: r for r in json.loads(done.stdout)}


def _pytest(env: training_env.TrainingEnv, root: Path) -> subprocess.CompletedProcess[str]:
    return env.run(["python", "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=root)


def test_a_scaffolded_plugin_installs_applies_reverts_and_checks(tmp_path: Path) -> None:
    root = tmp_path / "acme-plugin"
    args = ["--id", ID, "--pr", "9999", "--repo", "https://github.com/acme/Megatron-LM.git"]
    target = ["--target", "megatron.core.utils:divide", "--sha", "abc1234" + "0" * 33]
    assert cli.main(["new", *args, *target, "--dest", str(root)]) == 0
    env = training_env.create(tmp_path / "venv", always=_ONE_BUILTIN_BESIDE_IT)
    _install(env, root)

    untouched = _pytest(env, root)
    print("generated tests, untouched:", untouched.stdout.strip().splitlines()[-1])
    assert untouched.returncode == 1, untouched.stdout
    # registered and head_sha set: the rest fail (the contract kit among them)
    assert "5 failed, 2 passed" in untouched.stdout

    _fill_in(root)
    _install(env, root)
    filled = _pytest(env, root)
    print("generated tests, filled in:", filled.stdout.strip().splitlines()[-1])
    assert filled.returncode == 0, filled.stdout + filled.stderr

    status = _json(env.run(["backports", "status", "--json"]))
    assert (status[ID]["verdict"], status[ID]["action"], status[ID]["source"]) == (
        "needed",
        "would-install",
        f"{DIST} 0.1.0",
    )
    assert status["megatron-lm-7617"]["source"] == "builtin"
    assert "AssertionError" in json.dumps(status[ID]["evidence"]["behaviour"])

    applied = _json(env.run(["backports", "apply", "--json"]))
    assert (applied[ID]["action"], applied[ID]["source"]) == ("installed", f"{DIST} 0.1.0")
    fresh = json.loads(env.run(["python", "-c", PROBE_DIVIDE]).stdout)
    assert fresh == {"backport": ID, "raised": "ValueError"}  # the hook, in a new process
    hooked = _pytest(env, root)  # the generated tests pass with the start-up hook there too
    assert hooked.returncode == 0, hooked.stdout + hooked.stderr

    reverted = _json(env.run(["backports", "revert", "--json"]))
    assert reverted[ID]["action"] == "reverted"
    fresh = json.loads(env.run(["python", "-c", PROBE_DIVIDE]).stdout)
    assert fresh == {"backport": None, "raised": "AssertionError"}  # megatron-core's own

    check = env.run(["backports", "check"])
    print("backports check:\n" + check.stdout)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"{ID} " in check.stdout

    vendored = env.site_packages / PACKAGE / "vendor" / "acme_9999" / "utils.py"
    vendored.write_text(vendored.read_text() + "# a hand edit\n")
    check = env.run(["backports", "check", "--json"])
    print("backports check after the edit:", check.stderr.strip())
    assert check.returncode == 1
    row = _json(check)[ID]
    assert row["check"]["ok"] is False and "edited" in row["reason"]
    assert f"--backport {ID} --rehash" in row["reason"]  # handwritten: the fix, named

    skipped = env.run(["backports", "check"], extra_env={"MEGATRON_BACKPORTS_SKIP_PLUGINS": DIST})
    assert skipped.returncode == 0, skipped.stdout  # turned off, not imported
