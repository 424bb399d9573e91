"""Whether the scheduler process can still answer, seen from both sides.

In the scheduler: a thread with its own ZMQ socket sends a :class:`~.io_struct.Heartbeat`
every interval, however long a round runs, so only a stopped or dead process
misses one; the heartbeat says how long the running round has run. The
scheduler never outlives the server: on Linux the kernel kills it when its
parent exits (``prctl(PR_SET_PDEATHSIG)``), and a thread that waits on the
parent's end of a pipe does the same on any system, whatever the round loop is
doing.

In the server: :class:`SchedulerMonitor` notices, within a tick, the scheduler
process exiting, no heartbeat for ``--heartbeat-timeout`` seconds (the process
stopped, e.g. ``SIGSTOP``), or a round past ``--watchdog-timeout`` (SGLang's
flag); it reports why, once. The server then answers every waiting and every
new request 503 and exits non-zero, as SGLang takes its server down so that a
supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Optional

import zmq

from .io_struct import Heartbeat

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def heartbeat_interval(timeout: float) -> float:
    """Seconds between heartbeats for a ``timeout`` (seconds): a few are missed
    before the scheduler counts as stopped, and one comes at least every second."""
    return min(1.0, timeout / 4)


def die_with_parent() -> None:
    """End this process when its parent (the server) does, even mid-round.

    Call it first thing in a ``multiprocessing`` child. Linux's parent-death
    signal kills at once; the watcher thread covers other systems and a parent
    that exited before the signal was set.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
        except (AttributeError, OSError):  # no prctl: the watcher alone
            pass
    parent = multiprocessing.parent_process()
    if parent is None:  # not a multiprocessing child: nothing to watch
        return

    def watch():
        parent.join()  # returns once the parent's end of the pipe closes
        os._exit(1)

    threading.Thread(target=watch, name="flide-parent-watch", daemon=True).start()


class RoundClock:
    """When the scheduler's running round started (None between rounds); read
    by the heartbeat thread (one float: no lock needed)."""

    def __init__(self):
        self.started: Optional[float] = None

    @contextmanager
    def running(self):
        self.started = time.monotonic()
        try:
            yield
        finally:
            self.started = None

    def seconds(self) -> Optional[float]:
        """How long the running round has run, in seconds (None between rounds)."""
        started = self.started
        return None if started is None else time.monotonic() - started


def start_heartbeat(context: zmq.Context, address: str, interval: float, clock: RoundClock) -> None:
    """Send a Heartbeat to ``address`` every ``interval`` seconds from a daemon
    thread, on a socket of its own (ZMQ sockets are not thread-safe)."""

    def beat():
        socket = context.socket(zmq.PUSH)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(address)
        while True:
            try:  # never block: a server that reads none has its own monitor's verdict
                socket.send_pyobj(Heartbeat(clock.seconds()), zmq.NOBLOCK)
            except zmq.Again:
                pass
            time.sleep(interval)

    threading.Thread(target=beat, name="flide-heartbeat", daemon=True).start()


class SchedulerMonitor:
    """Watches the scheduler process from the server's event loop.

    Args:
        process: the scheduler's ``multiprocessing.Process``.
        heartbeats: a ZMQ PULL socket the scheduler's heartbeats arrive on
            (read without blocking, all of them before each verdict, so a busy
            event loop never counts as a missed heartbeat).
        heartbeat_timeout: seconds without a heartbeat after which the scheduler
            counts as stopped.
        watchdog_timeout: seconds a round may run (SGLang's ``--watchdog-timeout``).
        on_failure: called once, on the event loop, with why the scheduler can
            no longer answer (a sentence).
    """

    def __init__(self, process, heartbeats, heartbeat_timeout: float, watchdog_timeout: float,
                 on_failure: Callable[[str], None]):
        self.process = process
        self.heartbeats = heartbeats
        self.heartbeat_timeout = heartbeat_timeout
        self.watchdog_timeout = watchdog_timeout
        self.on_failure = on_failure
        self.failure: Optional[str] = None
        self._task: Optional[asyncio.Task] = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    def stop(self) -> None:
        """Stop watching (the server is stopping the scheduler itself)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def check(self, last_heartbeat: float, now: float) -> tuple[float, Optional[str]]:
        """One verdict: the time of the latest heartbeat (monotonic seconds) and
        why the scheduler failed (None while it is well)."""
        code = self.process.exitcode
        if code is not None:
            return last_heartbeat, f"the scheduler process exited with code {code}"
        latest = None
        while True:
            try:
                latest = self.heartbeats.recv_pyobj(zmq.NOBLOCK)
            except zmq.Again:
                break
        if latest is None:
            silent = now - last_heartbeat
            if silent > self.heartbeat_timeout:
                return last_heartbeat, (f"the scheduler process sent no heartbeat for {silent:.1f} s "
                                        f"(--heartbeat-timeout {self.heartbeat_timeout:g}); it is stopped or hung")
            return last_heartbeat, None
        if latest.round_seconds is not None and latest.round_seconds > self.watchdog_timeout:
            return now, (f"a round has run {latest.round_seconds:.1f} s, past the watchdog limit "
                         f"(--watchdog-timeout {self.watchdog_timeout:g})")
        return now, None

    async def _watch(self) -> None:
        tick = heartbeat_interval(self.heartbeat_timeout) / 2
        last = time.monotonic()
        while True:
            await asyncio.sleep(tick)
            last, failure = self.check(last, time.monotonic())
            if failure is not None:
                self.failure = failure
                logger.error("Scheduler failure: %s; the server answers 503 and exits", failure)
                self.on_failure(failure)
                return
