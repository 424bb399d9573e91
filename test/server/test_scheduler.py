"""The scheduler's round log lines (SGLang logs each batch the same way), a cut round's too."""

import logging

from flide_ext.runtime.graph_capacities import GraphCapacity
from flide_ext.runtime.round_result import RoundResult, RoundStats
from flide_ext.server.scheduler import log_round


def _result(graph):
    stats = RoundStats(requests=2, questions=20, stream_tokens=536, resumed_tokens=3328, plan_seconds=0.0016,
                       forward_seconds=0.0131, tables_seconds=0.0009, gpu_seconds=0.0117)
    return RoundResult(stats=stats, graphs=[graph])


def test_a_round_is_logged_at_info(caplog):
    with caplog.at_level(logging.INFO, logger="flide_ext.server.scheduler"):
        log_round(_result(GraphCapacity(640, 20, 4)), 0.0006, 3)
        log_round(_result(None), 0.0006, 0)
    first, second = (r.getMessage() for r in caplog.records)
    assert first.startswith("Decision round. #req: 2, #question: 20, #stream-token: 536, #cached-token: 3328, "
                            "graph: 640x20x4, plan: 1.60 ms, tables: 0.90 ms, gpu: 11.70 ms, forward: 13.10 ms")
    assert first.endswith("finish: 0.60 ms, #queue-req: 3")
    assert "graph: eager" in second


def test_nothing_is_formatted_above_info(caplog):
    with caplog.at_level(logging.WARNING, logger="flide_ext.server.scheduler"):
        log_round(_result(None), 0.0, 0)
    assert caplog.records == []


def test_a_cut_round_is_logged_at_info(caplog):
    from flide_ext.runtime.round_result import RoundCancelled
    from flide_ext.server.scheduler import log_cut

    with caplog.at_level(logging.INFO, logger="flide_ext.server.scheduler"):
        log_cut(RoundCancelled(1, 3, 5700, 2, 6, 1.2345), 4)
    assert [r.getMessage() for r in caplog.records] == [
        "Decision round cancelled. #req: 1, #question: 3, #stream-token: 5700, layers: 2/6, ran: 1234.50 ms, "
        "#queue-req: 4"]
