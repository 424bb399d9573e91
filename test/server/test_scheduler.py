"""The server's log lines (SGLang logs its batches the same way): each round at
debug, the rounds' stats every interval, a cut round, the ready line."""

import logging

from flide_ext.runtime.graph_capacities import GraphCapacity
from flide_ext.runtime.round_result import RoundResult, RoundStats
from flide_ext.server.round_log import log_round


def _result(graph):
    stats = RoundStats(requests=2, questions=20, stream_tokens=536, resumed_tokens=3328, plan_seconds=0.0016,
                       forward_seconds=0.0131, tables_seconds=0.0009, gpu_seconds=0.0117)
    return RoundResult(stats=stats, graphs=[graph])


def test_a_round_is_logged_at_debug(caplog):
    with caplog.at_level(logging.DEBUG, logger="flide_ext.server.round_log"):
        log_round(_result(GraphCapacity(640, 20, 4)), 0.0006, 3)
        log_round(_result(None), 0.0006, 0)
    first, second = (r.getMessage() for r in caplog.records)
    assert first.startswith("Decision round. #req: 2, #question: 20, #stream-token: 536, #cached-token: 3328, "
                            "graph: 640x20x4, plan: 1.60 ms, tables: 0.90 ms, gpu: 11.70 ms, forward: 13.10 ms")
    assert first.endswith("finish: 0.60 ms, #queue-req: 3")
    assert "graph: eager" in second


def test_nothing_is_formatted_above_debug(caplog):
    with caplog.at_level(logging.INFO, logger="flide_ext.server.round_log"):
        log_round(_result(None), 0.0, 0)
    assert caplog.records == []


def test_a_cut_round_is_logged_at_info(caplog):
    from flide_ext.runtime.round_result import RoundCancelled
    from flide_ext.server.round_log import log_cut

    with caplog.at_level(logging.INFO, logger="flide_ext.server.round_log"):
        log_cut(RoundCancelled(1, 3, 5700, 2, 6, 1.2345), 4)
    assert [r.getMessage() for r in caplog.records] == [
        "Decision round cancelled. #req: 1, #question: 3, #stream-token: 5700, layers: 2/6, ran: 1234.50 ms, "
        "#queue-req: 4"]


def test_round_stats_every_interval_and_after_the_first_round(caplog):
    from flide_ext.server.round_log import RoundStatsLog

    now = [100.0]
    stats = RoundStatsLog(3, clock=lambda: now[0])
    lines = []
    with caplog.at_level(logging.INFO, logger="flide_ext.server.round_log"):
        for i, graph in enumerate([None, GraphCapacity(640, 20, 4), None, GraphCapacity(640, 20, 4)]):
            now[0] += 0.5
            result = _result(graph)
            result.stats.prompt_tokens = 4000 + i
            lines.append(stats.add(result, 0.010 * (i + 1), waiting=i))
    assert lines[1] is None and lines[2] is None
    assert [r.getMessage() for r in caplog.records] == [lines[0], lines[3]]
    # The first round alone, over its own 10 ms; then rounds 2-4 over the 1.5 s since.
    assert lines[0] == ("Decision stats. #round: 1 (eager: 1), #req: 2, #question: 20, #stream-token: 536, "
                        "#saved-token: 3464, #cached-token: 3328, round: 10.00 ms mean, 10.00 ms max, "
                        "question/s: 2000.0, #queue-req: 0")
    assert lines[3] == ("Decision stats. #round: 3 (eager: 1), #req: 6, #question: 60, #stream-token: 1608, "
                        "#saved-token: 10398, #cached-token: 9984, round: 30.00 ms mean, 40.00 ms max, "
                        "question/s: 40.0, #queue-req: 3")


def test_the_ready_line_names_url_model_graphs_memory_and_times():
    from flide_ext.server.round_log import ready_line

    info = {"graphs": {"count": 67, "seconds": 25.04}, "load_seconds": 12.3,
            "memory": {"weights": 8 * 2 ** 30, "states": 2 ** 29, "cache": 20 * 2 ** 30},
            "warmup": {"rounds": 16, "seconds": 9.87}}
    assert ready_line("http://127.0.0.1:30000", "qwen", "bfloat16", info, 61.0) == (
        "Decision server ready at http://127.0.0.1:30000. model: qwen, dtype: bfloat16, graphs: 67 captured in "
        "25.0 s, memory: weights 8.00 GB, states 512.0 MB, cache 20.00 GB, load: 12.3 s, warm-up: 16 rounds in "
        "9.9 s, start-up: 61.0 s")
    assert "warm-up: none" in ready_line("http://h:1", "m", "float32", {**info, "warmup": None}, 1.0)
    assert ready_line("http://h:1", "m", "float32", info, 1.0, "prefix_cache").endswith(
        "start-up: 1.0 s, execution strategy: prefix_cache")
