"""Warm-up rounds at start: every kernel variant a round can hit, compiled
before the first request.

Triton compiles a kernel the first time it sees a new specialization of its
arguments (an integer equal to 1, divisible by 16, or neither; a flag on or
off), and an eager round meets ones that no graph capture did: the captures
run every kernel at the graphs' padded sizes (multiples of 32), while an eager
round runs at its own. On a fresh GPU machine the first large eager round of a
RACE-like burst took seconds instead of a tenth of one. So the scheduler runs
these rounds before it says it is ready: random token ids in the shapes
decision requests take (one question alone; a state forked to a few
questions; to many short ones; to a few after a long state; many requests in
one round; a request resuming from the state cache, past its state and exactly
at it), each pass twice when the engine has flat graphs (eagerly, then as
rounds are served: replayed or eager by cost), then empties the state cache.
Every other round is normalised over its labels (the readout that computes
only the labels' logits), the others over the vocabulary.
Every round is one :meth:`~.engine.Engine.run_rounds` call, so a small round
capacity splits it and a short context length shortens its prompts.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)

WARMUP_SEED = 0
# (state tokens, question tokens per question) of each request of each round,
# before they are fitted to the engine's capacity and context length: a RACE-,
# MultiRC- and QuALITY-like question, lengths odd and multiples of 16.
_ROUNDS = (
    [(0, [465])],
    [(1001, [33, 40, 47, 61, 16])],
    [(1000, [13 + (7 * i) % 29 for i in range(30)])],
    [(4501, [57, 64, 71, 80])],
    [(700, [31, 22, 17]), (1024, [48] * 4), (333, [9] * 7), (0, [129]), (0, [512]), (0, [1000])],
    [(0, [465])] * 35,
)
# The resumed round: the forked round's state grown by this many tokens, then
# questions of these lengths; beside it, a request asking at the state itself.
_GROWTH, _RESUMED_QUESTIONS, _AT_STATE = 203, [35, 44], [29]
_LABELS = (1, 2)


@dataclass
class WarmupReport:
    """What :func:`warm_up` ran.

    Attributes:
        rounds: rounds run (both passes).
        eager_rounds: of them, the ones that ran eagerly.
        graph_rounds: the ones that replayed a flat graph.
        stream_tokens: flat-stream tokens computed, summed over the rounds.
        resumed_tokens: state tokens resumed from the state cache, summed.
        seconds: wall time, in seconds.
    """

    rounds: int = 0
    eager_rounds: int = 0
    graph_rounds: int = 0
    stream_tokens: int = 0
    resumed_tokens: int = 0
    seconds: float = 0.0


def _fitted(shape: tuple, vocab: int, limit: int, tokens: int, segments: int, rng) -> tuple[list, list]:
    # One request's (state, prompts) for a (state tokens, question tokens) shape:
    # its lengths scaled down until every prompt is within ``limit`` tokens and
    # the request within a round.
    state_len, lengths = shape
    lengths = list(lengths)[: max(1, segments - 1)]
    scale = min(1.0, limit / (state_len + max(lengths)), tokens / (state_len + sum(lengths)))
    state = rng.integers(0, vocab, int(state_len * scale)).tolist()
    return state, [state + rng.integers(0, vocab, max(1, int(n * scale))).tolist() for n in lengths]


def warmup_rounds(vocab_size: int, context_length: int, tokens: int, segments: int,
                  seed: int = WARMUP_SEED) -> list[list[tuple]]:
    """The warm-up's rounds, each a list of requests ``(prompts, label ids per
    prompt)`` (prompts are lists of token ids in ``[0, vocab_size)``).

    Args:
        vocab_size: the model's vocabulary size.
        context_length: prompts are shorter than this, in tokens.
        tokens, segments: a round's capacity: each request fits one round.
        seed: the token ids' random seed (the same rounds at every start).
    """
    rng = np.random.default_rng(seed)
    labels = [label % vocab_size for label in _LABELS]
    limit = max(1, context_length - 1)
    rounds, states = [], []
    for shapes in _ROUNDS:
        fitted = [_fitted(shape, vocab_size, limit, tokens, segments, rng) for shape in shapes]
        states.append(fitted[0][0])
        rounds.append([(prompts, [labels] * len(prompts)) for _, prompts in fitted])
    # Resuming from the state cache (after the forked round): its state grown,
    # and its state itself asked again.
    state = states[1]
    grown = (state + rng.integers(0, vocab_size, _GROWTH).tolist())[: max(0, min(limit, tokens) - 64)]
    resumed = [_fitted((0, lengths), vocab_size, limit - len(base), tokens - len(base), segments, rng)[1]
               for base, lengths in ((grown, _RESUMED_QUESTIONS), (state, _AT_STATE))]
    rounds.insert(2, [([base + p for p in prompts], [labels] * len(prompts))
                      for base, prompts in zip((grown, state), resumed)])
    return rounds


def warm_up(engine, seed: int = WARMUP_SEED) -> WarmupReport:
    """Run the warm-up rounds (:func:`warmup_rounds`) on ``engine``, then empty
    its state cache; the answers are dropped.

    With flat graphs the rounds run twice: all eagerly
    (:attr:`~.graph_runner.GraphRunner.eager`), then as rounds are served.

    Args:
        engine: a :class:`~.engine.Engine`.
        seed: the token ids' random seed.

    Returns:
        The :class:`WarmupReport`.
    """
    started = time.perf_counter()
    graphs = engine.graphs
    rounds = warmup_rounds(engine.vocab_size, engine.context_length, engine.round_capacity.tokens,
                           engine.round_capacity.segments, seed)
    report = WarmupReport()
    before = (graphs.eager_rounds, graphs.replays) if graphs is not None else (0, 0)
    for eager in ((True, False) if graphs is not None and graphs.mode != "off" else (False,)):
        with _eager(graphs) if eager else nullcontext():
            for k, groups in enumerate(rounds):
                # Every other round normalised over its labels: their kernel compiles too.
                result = engine.run_rounds(groups, over_labels=[k % 2 == 1] * len(groups))
                report.rounds += len(result.graphs)
                report.stream_tokens += result.stats.stream_tokens
                report.resumed_tokens += result.stats.resumed_tokens
        engine.flush_cache()  # each pass resumes from what its own rounds left
    if graphs is not None:
        report.eager_rounds = graphs.eager_rounds - before[0]
        report.graph_rounds = graphs.replays - before[1]
    else:
        report.eager_rounds = report.rounds
    report.seconds = time.perf_counter() - started
    logger.info("Warm-up done. #round: %d (eager: %d, graph: %d), #stream-token: %d, #cached-token: %d, %.1f s",
                report.rounds, report.eager_rounds, report.graph_rounds, report.stream_tokens, report.resumed_tokens,
                report.seconds)
    return report


@contextmanager
def _eager(graphs):
    # The graph runner's eager switch, set for a block and cleared after it.
    graphs.eager = True
    try:
        yield
    finally:
        graphs.eager = False
