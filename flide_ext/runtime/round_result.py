"""What a round (or a batch of rounds) gives back: the answers and what it took
to compute them, returned to the caller rather than left on the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class RoundStats:
    """What one round computed.

    Attributes:
        requests: requests answered in the round.
        questions: prompts answered (one per question).
        prompt_tokens: sum of every question's full prompt length (what one
            sequence per question would compute).
        stream_tokens: tokens in the flat stream (what Flide computed).
        segments: segments in the prefix tree.
        levels: depth of the deepest tree + 1.
        resumed_tokens: state tokens not recomputed because a request resumed
            from a checkpoint (counted once per request).
        plan_seconds: host time before the forward (cache match, plan, pool rows).
        forward_seconds: the forward and the label gather, until the answers are
            on the host.
        finish_seconds: host time after it (checkpoints kept, rows released,
            eviction; keeping checkpoints overlaps the forward on the GPU).
        tables_seconds: of the forward, the host's padding, kernel tables and
            their copy to the device (replayed rounds; 0 when eager or on the CPU).
        gpu_seconds: of the forward, its span on the GPU (CUDA events around a
            graph replay or an eager forward; 0 on the CPU).
    """

    requests: int = 0
    questions: int = 0
    prompt_tokens: int = 0
    stream_tokens: int = 0
    segments: int = 0
    levels: int = 0
    resumed_tokens: int = 0
    plan_seconds: float = 0.0
    forward_seconds: float = 0.0
    finish_seconds: float = 0.0
    tables_seconds: float = 0.0
    gpu_seconds: float = 0.0

    @property
    def tokens_saved(self) -> int:
        return self.prompt_tokens - self.stream_tokens

    def plus(self, other: "RoundStats") -> "RoundStats":
        """Two rounds' stats together (counts and times add; levels is the deeper one's)."""
        return RoundStats(
            requests=self.requests + other.requests, questions=self.questions + other.questions,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens, stream_tokens=self.stream_tokens + other.stream_tokens,
            segments=self.segments + other.segments, levels=max(self.levels, other.levels),
            resumed_tokens=self.resumed_tokens + other.resumed_tokens,
            plan_seconds=self.plan_seconds + other.plan_seconds,
            forward_seconds=self.forward_seconds + other.forward_seconds,
            finish_seconds=self.finish_seconds + other.finish_seconds,
            tables_seconds=self.tables_seconds + other.tables_seconds,
            gpu_seconds=self.gpu_seconds + other.gpu_seconds,
        )


@dataclass
class RoundResult:
    """One round's (or a batch's rounds') answers and accounting, per request in
    the order the requests were given.

    Attributes:
        answers: per request, per prompt, the full-vocabulary log-probability of
            each of its labels (Python floats from float32 log-softmax).
        stream_tokens: per request, the flat-stream tokens of its prefix tree.
        resumed_tokens: per request, the state tokens it resumed from a
            checkpoint (not recomputed).
        kept_tokens: per request, the tokens of the state kept as a checkpoint
            (0: none kept).
        stats: the rounds' :class:`RoundStats` together.
        graphs: per round, the CUDA-graph capacity it replayed (None: eager).
    """

    answers: List[List[List[float]]] = field(default_factory=list)
    stream_tokens: List[int] = field(default_factory=list)
    resumed_tokens: List[int] = field(default_factory=list)
    kept_tokens: List[int] = field(default_factory=list)
    stats: RoundStats = field(default_factory=RoundStats)
    graphs: list = field(default_factory=list)

    @property
    def graph(self) -> Optional[object]:
        """The capacity the last round replayed (None: eager or no round)."""
        return self.graphs[-1] if self.graphs else None


def round_result(n: int, requests: List[int], label_logprobs: list, prompts: list, plan, resumed: List[int],
                 kept: List[int], graph, seconds: tuple) -> RoundResult:
    """One round's RoundResult.

    Args:
        n: requests in the round.
        requests: per prompt, its request's index.
        label_logprobs: per prompt, its labels' log-probabilities.
        prompts: per prompt, its token ids.
        plan: the round's :class:`~flide_ext.plan.flat.FlatPlan`.
        resumed: per request, the state tokens it resumed.
        kept: per request, the tokens of the checkpoint it left (0: none).
        graph: the capacity replayed (None: eager).
        seconds: ``(plan, forward, finish, tables, gpu)`` seconds of the round
            (:class:`RoundStats`).
    """
    stream = [0] * n
    for seg in plan.tree.segments:
        stream[seg.request] += len(seg.tokens)
    answers: List[List[List[float]]] = [[] for _ in range(n)]
    for r, values in zip(requests, label_logprobs):
        answers[r].append(values)
    stats = RoundStats(requests=n, questions=len(prompts), prompt_tokens=sum(len(p) for p in prompts),
                       stream_tokens=plan.num_tokens, segments=plan.num_segments, levels=plan.num_levels,
                       resumed_tokens=sum(resumed), plan_seconds=seconds[0], forward_seconds=seconds[1],
                       finish_seconds=seconds[2], tables_seconds=seconds[3], gpu_seconds=seconds[4])
    return RoundResult(answers, stream, resumed, kept, stats, [graph])


class RoundCancelled(Exception):
    """A round stopped before its end because every one of its requests was
    cancelled (:meth:`~flide_ext.runtime.engine.Engine.run_round`'s ``cancelled``):
    nothing was answered and nothing kept in the state cache.

    Attributes:
        requests: requests in the round.
        questions: their prompts.
        stream_tokens: tokens of the round's flat stream.
        layers_run: layers computed before it stopped (of ``layers``).
        layers: the model's layers.
        seconds: host seconds from the round's start until it stopped.
    """

    def __init__(self, requests: int, questions: int, stream_tokens: int, layers_run: int, layers: int,
                 seconds: float):
        super().__init__(f"the round of {requests} requests was cancelled after {layers_run} of {layers} layers")
        self.requests, self.questions, self.stream_tokens = requests, questions, stream_tokens
        self.layers_run, self.layers, self.seconds = layers_run, layers, seconds


class BatchAnswers(list):
    """A batch's answers in request order (each an answer or the RequestError that
    kept its request out), with the :class:`RoundStats` of the rounds that
    answered them as ``stats``."""

    def __init__(self, items=(), stats: Optional[RoundStats] = None):
        super().__init__(items)
        self.stats = stats if stats is not None else RoundStats()
