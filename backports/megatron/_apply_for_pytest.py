"""A pytest plugin (``-p backports.megatron._apply_for_pytest``) for ``upstream-tests``.

In the child pytest that runs upstream's tests: with ``BACKPORTS_UPSTREAM_TESTS_ID`` set,
it applies that backport (strictly: a refusal fails the run) before any test module is
collected; in both runs it writes to the JSON file ``BACKPORTS_UPSTREAM_TESTS_REPORT``
names each test's outcome by node id, the first error line of each test that did not pass
(with where it was raised), and the environment the tests ran in. The file is rewritten
after every test, so a run stopped at its time limit still tells what it finished.

With ``BACKPORTS_UPSTREAM_TESTS_OFFLINE`` set (``upstream-tests`` sets it), the run is
offline from the moment this plugin is imported, before any ``conftest.py``: a connection
(or a name lookup) to anything but loopback or a local socket fails with
``ConnectionRefusedError``, and the test that tried is reported as needing the network.
"""

import errno
import ipaddress
import json
import os
import socket
import sys
import sysconfig
from typing import Any

_outcomes: dict[str, str] = {}
_skips: dict[str, str] = {}  # node id -> why it was skipped (a CUDA-only test on CPU, ...)
_errors: dict[str, dict[str, str]] = {}  # node id -> {"line": ..., "where": "path:line"}
_rootdir: list[str] = []
_network: dict[str, str] = {}  # node id (or "<collection>") -> the address it tried first
NETWORK = "needs the network"
_LOCAL_NAMES = frozenset({"", "localhost", "localhost.localdomain", "ip6-localhost"})


def _loopback(host: object) -> bool:
    if host is None:
        return True
    name = str(host.decode() if isinstance(host, bytes) else host).strip("[]").lower()
    if name in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(name.split("%")[0]).is_loopback
    except ValueError:
        return False


def _current_test() -> str:
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    return current.rsplit(" (", 1)[0] if current else "<collection>"


def _refuse(host: object, port: object) -> None:
    where = f"{host}:{port}"
    _network.setdefault(_current_test(), where)
    raise ConnectionRefusedError(
        errno.ECONNREFUSED,
        f"{NETWORK}: backports upstream-tests runs offline (a connection to {where})",
    )


def _go_offline() -> None:
    """Refuse every connection and name lookup but loopback's, in this process."""
    connect, connect_ex, getaddrinfo = (
        socket.socket.connect,
        socket.socket.connect_ex,
        socket.getaddrinfo,
    )
    inet = (socket.AF_INET, socket.AF_INET6)

    def offline_connect(self: socket.socket, address: Any) -> None:
        if self.family in inet and not _loopback(address[0]):
            _refuse(address[0], address[1])
        connect(self, address)

    def offline_connect_ex(self: socket.socket, address: Any) -> int:
        if self.family in inet and not _loopback(address[0]):
            _refuse(address[0], address[1])
        return connect_ex(self, address)

    def offline_getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if not _loopback(host):
            try:
                ipaddress.ip_address(str(host).strip("[]").split("%")[0])
            except ValueError:  # a name to look up: that is the network already
                _refuse(host, port)
        return getaddrinfo(host, port, *args, **kwargs)

    socket.socket.connect = offline_connect  # type: ignore[method-assign, assignment]
    socket.socket.connect_ex = offline_connect_ex  # type: ignore[method-assign, assignment]
    socket.getaddrinfo = offline_getaddrinfo


if os.environ.get("BACKPORTS_UPSTREAM_TESTS_OFFLINE"):
    _go_offline()


def pytest_configure(config: Any) -> None:
    _rootdir.append(str(config.rootpath))
    backport_id = os.environ.get("BACKPORTS_UPSTREAM_TESTS_ID")
    if backport_id:
        from backports.megatron import apply

        apply(backport_id, strict=True)
    _write()


def _where(path: str, lineno: int) -> str:
    """``path:line``, relative to the checked-out tests or from ``site-packages/`` on."""
    root = _rootdir[0] + os.sep if _rootdir else None
    if root and path.startswith(root):
        path = path[len(root) :]
    elif "site-packages" + os.sep in path:
        path = path.rsplit("site-packages" + os.sep, 1)[1]
    return f"{path}:{lineno}"


def _in_stdlib(path: str) -> bool:
    stdlib = sysconfig.get_paths()["stdlib"] + os.sep
    return path.startswith("<") or (path.startswith(stdlib) and "site-packages" not in path)


def _raised_at(longrepr: Any) -> str:
    """The deepest frame of the traceback outside the standard library (``os.environ``'s
    KeyError is news about the caller's line, not about ``<frozen os>``)."""
    entries = getattr(getattr(longrepr, "reprtraceback", None), "reprentries", [])
    for entry in reversed(entries):
        location = getattr(entry, "reprfileloc", None)
        if location is not None and not _in_stdlib(str(location.path)):
            return _where(str(location.path), int(location.lineno))
    crash = getattr(longrepr, "reprcrash", None)
    return _where(str(crash.path), int(crash.lineno)) if crash is not None else ""


def _first_error(report: Any) -> dict[str, str]:
    """The exception's own line (``ZeroDivisionError: ...``) and where it was raised."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        line = str(crash.message).strip().splitlines()
        return {"line": line[0] if line else "", "where": _raised_at(report.longrepr)}
    text = str(getattr(report, "longreprtext", "") or report.longrepr or "")
    marked = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
    lines = marked or [ln.strip() for ln in text.splitlines() if ln.strip()]
    return {"line": lines[-1] if lines else "", "where": ""}


def pytest_runtest_logreport(report: Any) -> None:
    if report.when == "call" or report.outcome != "passed":
        if report.failed:
            outcome = "failed" if report.when == "call" else "error"
        else:
            outcome = str(report.outcome)
        if _outcomes.get(report.nodeid) in (None, "passed"):
            _outcomes[report.nodeid] = outcome
        if report.skipped and isinstance(report.longrepr, tuple):
            reason = str(report.longrepr[-1]).removeprefix("Skipped: ")
            _skips[report.nodeid] = reason
            _errors.setdefault(report.nodeid, {"line": f"skipped: {reason}", "where": ""})
        elif report.failed:
            _errors.setdefault(report.nodeid, _first_error(report))
            if report.nodeid in _network:  # whatever it raised, the network was why
                _errors[report.nodeid]["line"] = (
                    f"{NETWORK} (a connection to {_network[report.nodeid]}; "
                    f"upstream-tests runs offline): {_errors[report.nodeid]['line']}"
                )
    if report.when == "teardown":
        _write()


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _outcomes[report.nodeid] = "error"
        _errors.setdefault(report.nodeid, _first_error(report))
        _write()
    elif report.skipped and isinstance(report.longrepr, tuple):
        # A module-level skip (a test file that needs a GPU or Transformer Engine): its
        # tests are never collected, so the file is the row, with the reason as a note.
        _outcomes[report.nodeid] = "skipped"
        _skips[report.nodeid] = str(report.longrepr[-1]).removeprefix("Skipped: ")
        _write()


def _environment() -> dict[str, Any]:
    """What decides whether upstream's harness can run here: torch and its devices."""
    found: dict[str, Any] = {"python": sys.version.split()[0]}
    torch = sys.modules.get("torch")
    if torch is not None:
        found["torch"] = str(torch.__version__)
        try:
            found["cuda_devices"] = int(torch.cuda.device_count())
        except Exception as exc:  # a broken driver: that is the environment's news
            found["cuda_devices"] = 0
            found["cuda_error"] = f"{type(exc).__name__}: {exc}"
        distributed = getattr(torch, "distributed", None)
        if distributed is not None and distributed.is_available() and distributed.is_initialized():
            found["world_size"] = int(distributed.get_world_size())
    return found


def _write() -> None:
    path = os.environ.get("BACKPORTS_UPSTREAM_TESTS_REPORT")
    if not path:
        return
    data = {
        "outcomes": _outcomes,
        "skips": _skips,
        "errors": _errors,
        "environment": _environment(),
        "network": _network,
    }
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.replace(partial, path)  # a reader never sees half a file, even at a kill


def pytest_unconfigure(config: Any) -> None:
    _write()
