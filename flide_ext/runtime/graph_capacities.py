"""The flat CUDA graphs' capacities: what one graph holds, which graphs are
captured at start (:func:`default_capacities`), the ``--graph-capacities``
syntax (:func:`parse_capacities`), and which graph replays in another's place
(:func:`faster_graphs`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..kernels.tables import TableCapacity


@dataclass(frozen=True)
class GraphCapacity:
    """One graph's capacity.

    Attributes:
        tokens: stream rows.
        segments: segments; also the readout rows (each readout row ends a segment).
        levels: tree levels.
    """

    tokens: int
    segments: int
    levels: int = 4

    def __post_init__(self):
        for name in ("tokens", "segments", "levels"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"graph capacity {name} must be a positive integer, not {value!r}")

    @property
    def tables(self) -> TableCapacity:
        return TableCapacity(self.tokens, self.segments, self.levels)

    def holds(self, tokens: int, segments: int, levels: int, readouts: int) -> bool:
        return tokens <= self.tokens and segments <= self.segments and levels <= self.levels and readouts <= self.segments


def parse_capacities(text: str, levels: int = 4) -> list[GraphCapacity]:
    """``"512:32,4096:256:2"`` (``tokens:segments`` or ``tokens:segments:levels``,
    comma separated; ``levels`` when an entry gives none) -> capacities.

    Raises:
        ValueError: naming the entry that is not two or three positive decimal integers.
    """
    if type(levels) is not int or levels < 1:
        raise ValueError(f"graph capacity levels must be a positive integer, not {levels!r}")
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) not in (2, 3) or not all(p.isascii() and p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"graph capacity {item.strip()!r} is not tokens:segments[:levels] (positive integers)")
        numbers = [int(p) for p in parts]
        out.append(GraphCapacity(numbers[0], numbers[1], numbers[2] if len(numbers) == 3 else levels))
    return out


def default_capacities(tokens: int, segments: int, levels: int = 4, smallest: int = 256,
                       step: float = 2 ** 0.25, lean_tokens: int = 2048, lean_levels: int = 2,
                       fine_step: float = 2 ** 0.125, fine_tokens: int = 2048,
                       finest_step: float = 2 ** 0.0625, finest_tokens: int = 1024) -> list[GraphCapacity]:
    """Token capacities from ``smallest`` to ``tokens``, each ``finest_step`` times
    the last up to ``finest_tokens`` (rounded up to 32 rows), ``fine_step`` times
    up to ``fine_tokens`` and ``step`` times beyond (rounded up to 64 rows),
    each with a segment capacity of one per 32
    tokens (at least 8, at most ``segments``); the largest equals the round
    capacity, so every round that fits a round fits a graph. Up to
    ``lean_tokens``, each token capacity also gets a *lean* graph: one segment
    per 128 tokens (at least 2) and ``lean_levels`` levels, plus one segment
    per level beyond 2 (with the state cache on, a state cut at a checkpoint
    adds a level and a segment: ``lean_levels`` 3).

    The segment capacity also sizes the GDN chunk table (a segment adds at most
    one partial chunk), and fla-core's chunk kernels do a whole chunk's work for
    each padding entry: one segment per 16 tokens made a RACE question's graph
    run 5x its chunks. One per 32 still holds MultiRC's 31 segments per 1,050
    tokens; a round with more segments replays a larger graph. A round of one
    or a few requests with long questions (a single RACE question: one segment
    in 465 tokens; four: five in 735) fits the lean graph, whose chunk table is
    half as long (chunks plus segments: 8 + 4 against 8 + 16 at 512 tokens),
    with two inter-chunk launches per GDN layer instead of four. Lean graphs
    stop at ``lean_tokens`` to keep the capture short; larger rounds are
    compute-bound on their own rows.

    The steps bound the padding a round computes in vain (a 4B-sized model is
    compute-bound from a few hundred tokens on, so padded rows cost time): a
    capacity is at most ``fine_step`` times the one below it up to
    ``fine_tokens`` (9% more by default: a step of an agent resumed from the
    state cache computes a few hundred tokens, and every one of them counts in
    its latency), ``step`` times beyond (19%), against 2x for doubling, each
    plus the rounding (a 257-token round replays 288). Up to ``finest_tokens``
    the step is ``finest_step`` (4.4%, with 32-row rounding): there a round is a
    single question or an agent step (a RACE question's 465 tokens replay 480
    rows, an agent step of 536 replays 544), and each padded row costs about
    as much as a real one."""
    out, t = [], min(smallest, tokens)
    while t < tokens:
        out.append(GraphCapacity(t, min(segments, max(8, t // 32)), levels))
        if t <= lean_tokens:
            out.append(GraphCapacity(t, min(segments, max(2, t // 128) + lean_levels - 2), min(levels, lean_levels)))
        factor, rows = (finest_step, 32) if t < finest_tokens else (fine_step if t <= fine_tokens else step, 64)
        t = max(t + rows, -(-int(t * factor) // rows) * rows)
    out.append(GraphCapacity(tokens, segments, levels))
    return sorted(set(out), key=lambda c: (c.tokens, c.segments, c.levels))


# How much faster (a fraction of its replay) a larger graph must replay than the
# smallest one holding a round to be replayed instead (timing noise stays out).
FASTER_MARGIN = 0.03


def faster_graphs(replay_ms: dict, margin: float = FASTER_MARGIN) -> dict:
    """Which larger graph to replay in place of each graph: a GEMM's kernel (its
    tiles) is chosen by its row count, so a graph of more rows can replay faster
    than a smaller one (on the H200, cuBLAS's 480-row Qwen3.5-4B MLP GEMMs ran
    slower than its 512-row ones). A graph's stand-in holds every round it holds
    (no fewer tokens, segments or levels) and replays at least ``margin`` of its
    time faster; the fastest such graph is chosen.

    Args:
        replay_ms: ``{GraphCapacity: measured replay ms}``.
        margin: the fraction of a graph's replay time a stand-in must save.

    Returns:
        ``{capacity: the capacity to replay instead}``, only for graphs that have one.
    """
    out = {}
    for c, ms in replay_ms.items():
        bigger = [(d_ms, d.tokens, d.segments, d.levels, d) for d, d_ms in replay_ms.items()
                  if d != c and d.tokens >= c.tokens and d.segments >= c.segments and d.levels >= c.levels]
        if bigger:
            best = min(bigger, key=lambda t: t[:4])
            if best[0] < (1.0 - margin) * ms:
                out[c] = best[4]
    return out
