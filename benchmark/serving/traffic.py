"""Seeded ``/v1/score`` traffic: agent trajectories (a growing history, fresh
criteria each step) and fresh-state workloads shaped like RACE, MultiRC and
QuALITY (bench_decision's generators, so the shapes match the in-process benchmark).

Everything is a function of the seed and the request's identity (agent and step,
or request index), so a request can be rebuilt to resend it (``--check-cold``)
instead of being kept in memory.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .client import score_body

BENCHMARK = Path(__file__).resolve().parents[1]  # benchmark/, where bench_decision.py lies
WARMUP_AGENT = 10**6  # warm-up agents' ids start here: never one of the measured agents


def default_vocab() -> int:
    """The Qwen3.5-4B shape's vocabulary (bench_decision's default model)."""
    sys.path.insert(0, str(BENCHMARK.parent))
    from flide_ext.assets.random_checkpoints import qwen35_config

    return qwen35_config("qwen3.5-4b").vocab_size


@dataclass(frozen=True)
class AgentPlan:
    """Agent ``a`` at step ``s`` (0-based) sends its first ``start + s * growth``
    history tokens as the query and ``criteria`` fresh criteria of
    ``criteria_tokens`` tokens as the items, scored over label ids ``0..labels-1``."""

    start: int
    growth: int
    steps: int
    criteria: int
    criteria_tokens: int
    labels: int
    vocab: int
    seed: int

    def history_tokens(self, step: int) -> int:
        return self.start + step * self.growth

    def history(self, agent: int) -> np.ndarray:
        # The whole trajectory's history from the agent's own stream: each step's
        # query is a prefix of the next one's.
        longest = self.history_tokens(self.steps - 1)
        return np.random.default_rng([self.seed, agent]).integers(0, self.vocab, longest)

    def body(self, agent: int, step: int) -> dict:
        query = self.history(agent)[: self.history_tokens(step)]
        items = np.random.default_rng([self.seed, agent, step, 1]).integers(
            0, self.vocab, (self.criteria, self.criteria_tokens))
        return score_body(query.tolist(), items.tolist(), range(self.labels))


def schedule(workers: int, agents: int, steps: int) -> list[list[tuple[int, int]]]:
    """Per worker, its ``(agent, step)`` sequence: worker ``w`` owns the agents
    ``a % workers == w`` and takes them round-robin, step by step, so each agent's
    steps run in order and each waits for the previous answer."""
    return [[(a, s) for s in range(steps) for a in range(w, agents, workers)] for w in range(workers)]


def _split(prompts: list[list[int]], nominal_question: int) -> int:
    """Where the shared state ends: the prompts' common prefix (one prompt: its
    length less the workload's question length); at least one item token is left."""
    if len(prompts) == 1:
        return max(1, len(prompts[0]) - nominal_question)
    first, n = prompts[0], min(len(p) for p in prompts)
    k = 0
    while k < n and all(p[k] == first[k] for p in prompts):
        k += 1
    return max(1, min(k, n - 1))


def fresh_requests(workload: str, count: int, vocab: int, scale: float = 1.0, seed: int = 0,
                   vary: bool = False) -> list[dict]:
    """``count`` fresh-state ``/v1/score`` bodies of a bench_decision workload:
    query = the request's state, items = its questions' own tokens."""
    sys.path.insert(0, str(BENCHMARK))
    from bench_decision import requests_for  # also puts benchmark/kernels on sys.path
    from workloads import WORKLOADS

    question_len = max(1, int(WORKLOADS[workload][2] * scale))
    out = []
    for prompts, labels in requests_for(workload, count, vocab, scale, seed=seed, vary=vary):
        cut = _split(prompts, question_len)
        out.append(score_body(prompts[0][:cut], [p[cut:] for p in prompts], labels[0]))
    return out


def workload_names() -> list[str]:
    sys.path.insert(0, str(BENCHMARK / "kernels"))
    from workloads import WORKLOADS

    return list(WORKLOADS)
