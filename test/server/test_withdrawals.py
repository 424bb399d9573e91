"""What the scheduler knows of withdrawn requests while a round runs
(flide_ext/server/withdrawals.py): a round is cut only once all its requests
are withdrawn, whichever socket's Abort came first."""

from __future__ import annotations

import time

import zmq

from flide_ext.server.io_struct import Abort
from flide_ext.server.withdrawals import Withdrawals, start_abort_reader


def test_a_round_is_gone_only_once_every_request_is():
    w = Withdrawals()
    assert not w.all_gone()  # no round yet
    w.start_round([1, 2])
    w.add(1)
    assert not w.all_gone(), "request 2 is still awaited: the round runs on"
    w.add(2)
    assert w.all_gone()
    w.start_round([])
    assert not w.all_gone()  # a round of none is never cut


def test_an_abort_before_its_round_starts_counts_and_others_are_dropped():
    # The abort socket keeps no order with the work socket: request 3's Abort
    # may come before the round that holds it starts.
    w = Withdrawals()
    w.add(3)
    w.add(9)  # withdrawn while waiting (its work-socket Abort drops it), or already answered
    w.start_round([3])
    assert w.all_gone()
    w.start_round([9])
    assert not w.all_gone(), "9 was dropped when a round without it started"


def test_the_reader_records_aborts_from_another_process_socket(tmp_path):
    context = zmq.Context()
    push = context.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    try:
        w = Withdrawals()
        address = f"ipc://{tmp_path}/abort"
        start_abort_reader(context, address, w)
        push.connect(address)
        w.start_round([4, 5])
        push.send_pyobj(Abort(4))
        push.send_pyobj(Abort(5))
        deadline = time.monotonic() + 10
        while not w.all_gone() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert w.all_gone()
    finally:
        push.close()
        # term(), not destroy(): the reader's socket is closed by its own thread
        # (destroy() closed it from this one while the reader waited in it, and hung).
        context.term()
