"""The zygote (issue 43): one child imports torch once and forks a fresh interpreter per sniff
child; a forked one answers as a plain ``python -I`` child would, or is not used."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from backports.megatron.interpreter import children, zygote

# A module that says it ran (in the file named), where a child could take it from the
# working directory.
_SPY = "open({!r}, 'a').write(f'{{__name__}} ran\\n')\n"

_SEEN = """
import json, os, sys
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "path": sys.path, "torch": "torch" in sys.modules,
    "megatron": "megatron" in sys.modules, "switch": os.environ.get("MEGATRON_BACKPORTS"),
    "home": os.environ.get("HOME"),
}))
"""


def _forked(script: str, *args: str, timeout: float = 600) -> "subprocess.CompletedProcess[str]":
    done = children.run_python(script, args, shared_imports=True, timeout=timeout)
    # Forked from the zygote, not a plain child: its args say so (the -c script is "-c").
    assert zygote._CURRENT and zygote._CURRENT[0].hello is not None
    return done


def test_a_forked_child_is_a_fresh_isolated_interpreter(tmp_path, monkeypatch):
    """The request's argv, path and environment (the backports off); a private folder of
    its own; torch already imported and nothing of megatron; nothing taken from the
    caller's working directory."""
    folder = tmp_path / "cwd"
    (folder / "megatron").mkdir(parents=True)
    spy = _SPY.format(str(tmp_path / "ran.txt"))
    (folder / "json.py").write_text(spy)
    (folder / "megatron" / "__init__.py").write_text(spy)
    monkeypatch.chdir(folder)
    done = _forked(_SEEN + "import megatron\n", "one", "two")
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[0])
    assert seen["argv"] == ["-c", "one", "two"]
    assert seen["torch"] is True and seen["megatron"] is False  # megatron: after the print
    assert seen["switch"] == "0" and seen["home"] == os.environ.get("HOME")
    assert seen["path"] == children.child_path()
    assert Path(seen["cwd"]).parent.name.startswith("megatron-backports-child-")
    assert str(folder) not in seen["path"]
    assert not (tmp_path / "ran.txt").exists()  # neither json.py nor megatron/ ran
    # Each request its own folder, removed once it is answered.
    again = json.loads(_forked(_SEEN).stdout)
    assert again["cwd"] != seen["cwd"] and not os.path.exists(seen["cwd"])


def test_exit_status_and_errors_come_back_as_from_a_plain_child():
    assert _forked("import sys; sys.exit(3)").returncode == 3
    raised = _forked("print('before'); raise ValueError('from the child')")
    assert raised.returncode == 1 and raised.stdout == "before\n"
    assert raised.stderr.strip().splitlines()[-1] == "ValueError: from the child"
    killed = _forked("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.returncode == -9


def test_a_child_past_its_time_is_killed_and_the_caller_told():
    with pytest.raises(subprocess.TimeoutExpired):
        _forked("import time; time.sleep(120)", timeout=3)
    assert _forked("print('next')").stdout == "next\n"  # the zygote goes on serving


def test_a_path_that_finds_another_torch_gets_a_plain_child(tmp_path):
    """A folder first on the path with its own ``torch`` (a candidate in ``audit``, say):
    the zygote's torch is not what a fresh child would import, so a plain child runs."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("MINE = True\n")
    path = children.child_path([str(tmp_path)])
    done = children.run_python(
        "import torch; print(getattr(torch, 'MINE', False))",
        path=path,
        shared_imports=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
    assert zygote._finds_the_same(zygote._CURRENT[0].hello["origins"], path) is False
    assert zygote._finds_the_same(zygote._CURRENT[0].hello["origins"], children.child_path())


def test_switched_off_every_child_is_a_plain_one(monkeypatch):
    monkeypatch.setenv("MEGATRON_BACKPORTS_ZYGOTE", "0")
    assert (
        zygote.run(
            "pass", "<string>", "-c", [], path=sys.path, env={}, timeout=5, base_path=sys.path
        )
        is None
    )
    done = children.run_python(_SEEN, shared_imports=True, timeout=600)
    assert json.loads(done.stdout)["torch"] is False  # a fresh interpreter


def test_the_zygote_imports_nothing_of_megatron_or_of_this_project():
    """Its source imports only the standard library, and what it warms is torch's."""
    source = (Path(zygote.__file__).with_name("_zygote_child.py")).read_text()
    assert "backports" not in "".join(
        line for line in source.splitlines() if line.startswith(("import", "from"))
    )
    from backports.megatron.interpreter import _zygote_child

    assert all(name.split(".")[0] in ("torch", "sympy") for name in _zygote_child.WARM)
    _forked("pass")
    origins = zygote._CURRENT[0].hello["origins"]
    assert "torch" in origins
    assert not {"megatron", "flash_attn", "backports"} & set(origins)


def test_the_inductor_cache_folder_torch_sets_keeps_the_zygote(monkeypatch):
    """torch writes its default ``TORCHINDUCTOR_CACHE_DIR`` into ``os.environ`` on first use
    (a megatron import in the caller reaches it): the same environment for every import, so
    the zygote started before stays (a second one cost seconds of CPU); another folder is
    another environment, and another zygote."""
    from torch._inductor.runtime import cache_dir_utils

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    _forked("pass")
    first = zygote._CURRENT[0]
    cache_dir_utils.cache_dir()  # as torch does: sets os.environ to its default folder
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == os.path.abspath(
        cache_dir_utils.default_cache_dir()
    )
    _forked("pass")
    assert zygote._CURRENT[0] is first and first.alive()
    assert zygote._relevant({"TORCHINDUCTOR_CACHE_DIR": "/elsewhere"}) == {
        "TORCHINDUCTOR_CACHE_DIR": "/elsewhere"
    }
