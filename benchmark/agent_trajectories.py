"""Agent-trajectory workload: histories that grow every step, each step one
decision call whose state is the whole history so far.

An agent starts with ``start`` tokens of history and adds ``growth`` tokens per
step for ``steps`` steps; at every step it asks ``criteria`` questions of
``criteria_tokens`` tokens each (new ones every step), each answered over
``labels`` single-token labels. Token ids are seeded random ids, so the same
arguments give the same trajectories in every client and engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import statistics
import time

import numpy as np
import torch


@dataclass(frozen=True)
class AgentShape:
    """Attributes (tokens unless noted):
        start: history at the first step.
        growth: history added per step.
        steps: steps per agent.
        criteria: questions per step.
        criteria_tokens: tokens of each question.
        labels: label tokens per question.
    """

    start: int = 8000
    growth: int = 400
    steps: int = 8
    criteria: int = 10
    criteria_tokens: int = 30
    labels: int = 4


def agent_steps(shape: AgentShape, vocab: int, agent: int = 0, seed: int = 0) -> list[tuple[list[int], list[list[int]]]]:
    """One agent's steps: per step ``(history, criteria)``, the history so far
    and the step's criteria token ids. Ids lie in ``[16, vocab)``.

    Raises:
        ValueError: a non-positive start, steps, criteria or criteria length, or
            a negative growth.
    """
    if min(shape.start, shape.steps, shape.criteria, shape.criteria_tokens, shape.labels) < 1 or shape.growth < 0:
        raise ValueError(f"{shape}: start, steps, criteria, criteria_tokens and labels must be >= 1, growth >= 0")
    rng = np.random.default_rng([seed, agent])
    total = shape.start + shape.growth * (shape.steps - 1)
    history = rng.integers(16, vocab, total).tolist()
    out = []
    for step in range(shape.steps):
        criteria = rng.integers(16, vocab, (shape.criteria, shape.criteria_tokens)).tolist()
        out.append((history[: shape.start + step * shape.growth], criteria))
    return out


def label_ids(shape: AgentShape) -> list[int]:
    """The label token ids every question is answered over."""
    return list(range(1, shape.labels + 1))


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def step_groups(trajectories, step, labels):
    return [([history + c for c in criteria], [labels] * len(criteria)) for history, criteria in
            (t[step] for t in trajectories)]


def run_agents(engine, shape: AgentShape, agents: int, vocab: int, device, seed: int = 0, cold: bool = False) -> dict:
    """``agents`` agents stepping together in process (one round per step holds
    every agent's call): per-step wall time (ms), resumed and stream tokens,
    whether a graph replayed, decisions/s, and the cache's stats. With
    ``cold``, every step is sent again cold (the cache flushed before each)
    and ``cold_equal``/``cold_total`` count the bitwise equal answers.

    Args:
        engine: a :class:`flide_ext.Engine`; device: its device (for syncs).
    """
    labels = label_ids(shape)
    trajectories = [agent_steps(shape, vocab, agent=a, seed=seed) for a in range(agents)]
    steps, answers = [], []
    for step in range(shape.steps):
        groups = step_groups(trajectories, step, labels)
        _sync(device)
        t0 = time.perf_counter()
        result = engine.run_round(groups)
        _sync(device)
        seconds = time.perf_counter() - t0
        steps.append({"step": step, "ms": 1e3 * seconds, "resumed_tokens": sum(result.resumed_tokens),
                      "stream_tokens": result.stats.stream_tokens, "graph": result.graph is not None,
                      "decisions_per_s": agents * shape.criteria / seconds})
        answers.append(result.answers)
    later = [s["ms"] for s in steps[1:]] or [steps[0]["ms"]]
    out = {"agents": agents, "shape": shape.__dict__, "steps": steps, "first_step_ms": steps[0]["ms"],
           "later_p50_ms": statistics.median(later),
           "later_decisions_per_s": agents * shape.criteria * len(later) / (sum(later) / 1e3),
           "decisions_per_s": agents * shape.criteria * len(steps) / (sum(s["ms"] for s in steps) / 1e3),
           "cache": engine.cache_stats()}
    # Every step again, cold: the cache emptied before each request.
    equal = total = 0
    for step in range(shape.steps if cold else 0):
        for a, group in enumerate(step_groups(trajectories, step, labels)):
            engine.flush_cache()
            again = engine.run_round([group]).answers[0]
            total += 1
            equal += again == answers[step][a]
    out["cold_equal"], out["cold_total"] = equal, total
    engine.flush_cache()
    return out
