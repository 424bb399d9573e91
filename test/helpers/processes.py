"""Subprocesses as a user starts them: the ``flide`` CLI, and a server waited for."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
import requests


def quiet_env() -> dict:
    """This process's environment with Python's warnings off (the child's stderr is checked)."""
    return {**os.environ, "PYTHONWARNINGS": "ignore"}


def flide(*args, cwd=None):
    """Run ``flide ARGS`` (``python -m flide_ext.entrypoints.cli``) to completion."""
    return subprocess.run(
        [sys.executable, "-m", "flide_ext.entrypoints.cli", *args], capture_output=True, text=True, cwd=cwd,
        env=quiet_env(), timeout=600,
    )


def main_in_process(main, *args) -> subprocess.CompletedProcess:
    """``main(list(args))`` (a CLI's entry point) in this process, as a finished
    process: its return code and what it wrote to stdout and stderr. The
    refusals' one-line contract is checked once per CLI in a real subprocess;
    its other cases run here, without another interpreter's start."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse's refusals
            code = e.code if isinstance(e.code, int) else 2
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_health(url: str, proc, log) -> None:
    """Wait until ``url/health`` answers 200; fail with the server log if it dies or never does."""
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            if requests.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            time.sleep(0.5)
        if proc.poll() is not None:
            pytest.fail("server exited: " + log.read_text())
    proc.kill()
    pytest.fail("server did not start: " + log.read_text())


def start_server(command: list, log_dir, extra_env=None, **popen):
    """Start a server (``command`` without ``--port``) on a free port and wait for
    its health: ``(process, url, log path)``; ``extra_env``: variables added to
    :func:`quiet_env`; ``popen``: more Popen arguments."""
    port = free_port()
    log = log_dir / "server.log"
    proc = subprocess.Popen([*command, "--port", str(port)], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env={**quiet_env(), **(extra_env or {})}, **popen)
    url = f"http://127.0.0.1:{port}"
    wait_for_health(url, proc, log)
    return proc, url, log


def serving(command: list, log_dir):
    """:func:`start_server` for module fixtures: yields its URL, then stops it."""
    proc, url, _ = start_server(command, log_dir)
    yield url
    proc.terminate()
    proc.wait(30)


def scheduler_of(server_pid: int):
    """The server's scheduler process (``psutil.Process``): its multiprocessing child."""
    import psutil

    children = [p for p in psutil.Process(server_pid).children() if "spawn_main" in " ".join(p.cmdline())]
    assert len(children) == 1, children
    return children[0]


def wait_for_cpu(process, seconds: float, timeout: float = 60.0) -> None:
    """Wait until ``process`` (``psutil.Process``) has spent ``seconds`` of CPU
    (user and system, all its threads) since the call: an idle scheduler, which
    waits on its socket, spends none, so it is then computing a round.

    Raises:
        AssertionError: not within ``timeout`` seconds.
    """

    def spent():
        times = process.cpu_times()
        return times.user + times.system

    start, deadline = spent(), time.monotonic() + timeout
    while spent() - start < seconds:
        assert time.monotonic() < deadline, f"the process spent under {seconds} s of CPU in {timeout} s"
        time.sleep(0.02)


def running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, exited but not reaped, does not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
