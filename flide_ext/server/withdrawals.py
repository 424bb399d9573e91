"""Withdrawn requests, seen by the scheduler while a round runs.

The scheduler reads its work socket between rounds only, so an Abort sent there
(which withdraws a waiting request: it comes after its ScoreWork, on one
socket) waits until the running round ends. The tokenizer manager sends every
Abort to a second socket too, which a thread of the scheduler reads at any
time into a :class:`Withdrawals`: once every request of the running round is
withdrawn, the round stops after the layer it is in
(``Engine.run_round``'s ``cancelled``), and the next round starts that much sooner.

The two sockets keep no order between them: an Abort may come on the second
before its ScoreWork is read from the first. So every rid that comes is kept
until the next round starts, which keeps only its own: one of them withdrawn
before it started is then already known. The rids it drops are of requests
already answered or still waiting, which the Abort on the work socket withdraws.
"""

from __future__ import annotations

import threading
from typing import Iterable

import zmq


class Withdrawals:
    """The rids withdrawn lately, and the running round's; safe across threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self._gone: set = set()
        self._round: frozenset = frozenset()

    def add(self, rid: int) -> None:
        """Request ``rid`` was withdrawn (its client left, or it timed out)."""
        with self._lock:
            self._gone.add(rid)

    def start_round(self, rids: Iterable[int]) -> None:
        """A round of requests ``rids`` starts: only their withdrawals are kept."""
        with self._lock:
            self._round = frozenset(rids)
            self._gone &= self._round

    def all_gone(self) -> bool:
        """Whether every request of the round last started is withdrawn (false
        for a round of none)."""
        with self._lock:
            return bool(self._round) and self._round <= self._gone


def start_abort_reader(context: zmq.Context, address: str, withdrawals: Withdrawals) -> None:
    """Bind a PULL socket at ``address`` and record in ``withdrawals`` the rid of
    every :class:`~.io_struct.Abort` that comes there, from a daemon thread.

    The socket is bound here, so a bad address raises ``zmq.ZMQError`` here; from
    then on only the thread uses it (ZMQ sockets are not thread-safe; one may
    move to another thread, as here, at the thread's start), and ``context.term()``
    ends the thread. ``context.destroy()`` would close the socket from another
    thread while this one waits in it: it may hang.
    """
    socket = context.socket(zmq.PULL)
    socket.setsockopt(zmq.RCVHWM, 0)  # as the work socket: nothing is held back in the manager's process
    socket.setsockopt(zmq.LINGER, 0)
    socket.bind(address)

    def read():
        try:
            while True:
                withdrawals.add(socket.recv_pyobj().rid)
        except zmq.ContextTerminated:
            # The context is ending (its term() waits for every socket): close
            # this one here, the only thread that may.
            socket.close()

    threading.Thread(target=read, name="flide-aborts", daemon=True).start()
