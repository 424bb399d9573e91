"""The server's log lines, in SGLang's style (``key: value`` after a title):
the ready line, the stats of the rounds every ``--decode-log-interval`` rounds,
each round at debug, and a round cut short.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from .prefix_strategy import SERVED_STRATEGIES

logger = logging.getLogger(__name__)

GB, MB = 2 ** 30, 2 ** 20


def _size(n: int) -> str:
    # GB as SGLang's memory lines give them; MB below one.
    return f"{n / GB:.2f} GB" if n >= GB else f"{n / MB:.1f} MB"


def configure_logging(level: str) -> None:
    """Set Flide's loggers (``flide_ext.*``) to ``level`` with one stderr handler
    of SGLang's format (``[time] message``), whatever the launcher (SGLang's
    included) did to the root logger."""
    package = logging.getLogger("flide_ext")
    package.setLevel(level.upper())
    if not package.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%Y-%m-%d %H:%M:%S"))
        package.addHandler(handler)
    package.propagate = False


def ready_line(url: str, model: str, dtype: str, info: dict, seconds: float,
               strategy: str = SERVED_STRATEGIES[0]) -> str:
    """The line the server logs once it answers requests.

    Args:
        url: where it listens (``http://host:port``).
        model: the served model name.
        dtype: the compute dtype.
        info: the scheduler's SchedulerReady info: ``graphs`` (count and capture
            seconds), ``memory`` (bytes of weights, states and cache,
            :func:`flide_ext.runtime.memory.memory_bytes`), ``load_seconds`` and
            ``warmup`` (:class:`~flide_ext.runtime.warmup.WarmupReport` fields, or None).
        seconds: the server's start-up time, from the launch to listening.
        strategy: ``--execution-strategy``, named in the line when not the default.
    """
    memory = info.get("memory", {})
    graphs = info.get("graphs", {})
    warmup = info.get("warmup")
    warm = (f"warm-up: {warmup['rounds']} rounds in {warmup['seconds']:.1f} s" if warmup else "warm-up: none")
    return (f"Decision server ready at {url}. model: {model}, dtype: {dtype}, "
            f"graphs: {graphs.get('count', 0)} captured in {graphs.get('seconds', 0.0):.1f} s, "
            f"memory: weights {_size(memory.get('weights', 0))}, states {_size(memory.get('states', 0))}, "
            f"cache {_size(memory.get('cache', 0))}, load: {info.get('load_seconds', 0.0):.1f} s, {warm}, "
            f"start-up: {seconds:.1f} s"
            + ("" if strategy == SERVED_STRATEGIES[0] else f", execution strategy: {strategy}"))


class RoundStatsLog:
    """Sums rounds and logs them at info every ``interval`` rounds (and after
    the first round), as SGLang logs its decode batches every
    ``--decode-log-interval``.

    Args:
        interval: rounds per line (>= 1).
        clock: seconds, monotonic (tests give their own).
    """

    def __init__(self, interval: int, clock=time.perf_counter):
        self.interval, self.clock = interval, clock
        self.total_rounds = 0
        self._since = None
        self._reset()

    def _reset(self) -> None:
        self.rounds = self.eager = self.requests = self.questions = 0
        self.stream_tokens = self.saved_tokens = self.cached_tokens = 0
        self.seconds = self.longest = 0.0

    def add(self, result, seconds: float, waiting: int) -> Optional[str]:
        """Count one round; log (and return) the stats line when one is due.

        Args:
            result: the round's :class:`~flide_ext.runtime.round_result.RoundResult`.
            seconds: its time, from taking its requests to sending their answers.
            waiting: requests still waiting.
        """
        rs = result.stats
        if self._since is None:
            self._since = self.clock() - seconds
        self.rounds += 1
        self.total_rounds += 1
        self.eager += result.graph is None
        self.requests += rs.requests
        self.questions += rs.questions
        self.stream_tokens += rs.stream_tokens
        # What one sequence per question would have computed, less the stream.
        self.saved_tokens += rs.prompt_tokens - rs.stream_tokens
        self.cached_tokens += rs.resumed_tokens
        self.seconds += seconds
        self.longest = max(self.longest, seconds)
        if self.total_rounds != 1 and self.rounds < self.interval:
            return None
        now = self.clock()
        span = max(now - self._since, 1e-9)
        line = (f"Decision stats. #round: {self.rounds} (eager: {self.eager}), #req: {self.requests}, "
                f"#question: {self.questions}, #stream-token: {self.stream_tokens}, "
                f"#saved-token: {self.saved_tokens}, #cached-token: {self.cached_tokens}, "
                f"round: {1e3 * self.seconds / self.rounds:.2f} ms mean, {1e3 * self.longest:.2f} ms max, "
                f"question/s: {self.questions / span:.1f}, #queue-req: {waiting}")
        logger.info(line)
        self._since = now
        self._reset()
        return line


def log_round(result, finish: float, waiting: int) -> None:
    """One line per round at debug: its requests, questions, stream and resumed
    tokens, the graph it replayed (tokens x segments x levels, or eager), and
    its stages in ms (the forward's host tables and GPU span among them)."""
    if not logger.isEnabledFor(logging.DEBUG):
        return
    rs, graph = result.stats, result.graph
    shape = f"{graph.tokens}x{graph.segments}x{graph.levels}" if graph is not None else "eager"
    logger.debug("Decision round. #req: %d, #question: %d, #stream-token: %d, #cached-token: %d, graph: %s, "
                 "plan: %.2f ms, tables: %.2f ms, gpu: %.2f ms, forward: %.2f ms, finish: %.2f ms, #queue-req: %d",
                 rs.requests, rs.questions, rs.stream_tokens, rs.resumed_tokens, shape, 1e3 * rs.plan_seconds,
                 1e3 * rs.tables_seconds, 1e3 * rs.gpu_seconds, 1e3 * rs.forward_seconds, 1e3 * finish, waiting)


def log_cut(cut, waiting: int) -> None:
    """One line per round stopped because all its clients left, at info: its
    requests, questions and stream tokens, the layers it ran, and for how long."""
    logger.info("Decision round cancelled. #req: %d, #question: %d, #stream-token: %d, layers: %d/%d, "
                "ran: %.2f ms, #queue-req: %d", cut.requests, cut.questions, cut.stream_tokens, cut.layers_run,
                cut.layers, 1e3 * cut.seconds, waiting)
