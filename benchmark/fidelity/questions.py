"""The fidelity benchmark's question sets, as ``(prompts, labels)`` groups (one per
request: its questions' full prompt token ids and label token ids).

* ``race``, ``race_single``, ``multirc``, ``quality``: bench_decision's seeded
  random-token requests of those shapes (``benchmark/kernels/workloads.py``), each
  question over 4 (2 for MultiRC) label ids drawn once per set from the upper
  three quarters of the vocabulary (ordinary tokens, not a tokenizer's specials);
* ``examples``: the bundled decision requests (``examples/decisions.jsonl``)
  rendered by the engine's tokenizer and chat template, as the server renders them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bench_decision import OPTIONS, requests_for  # benchmark/ is on sys.path (bench_fidelity.py)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "decisions.jsonl"
TOKEN_SETS = tuple(OPTIONS)
SETS = TOKEN_SETS + ("examples",)


def token_groups(name: str, requests: int, vocab: int, scale: float = 1.0, seed: int = 0) -> list:
    """``requests`` groups of a random-token set (module docstring).

    Raises:
        KeyError: an unknown set name.
    """
    groups = requests_for(name, requests, vocab, scale, seed)
    rng = np.random.default_rng(seed)
    labels = sorted(rng.choice(np.arange(vocab // 4, vocab), size=OPTIONS[name], replace=False).tolist())
    return [(prompts, [labels] * len(prompts)) for prompts, _ in groups]


def example_groups(renderer, limit: int | None = None) -> list:
    """The bundled decision requests (the first ``limit``), rendered by ``renderer``
    (an engine's :class:`~flide_ext.protocol.decisions.DecisionRenderer`)."""
    from flide_ext.protocol.decisions import parse_decision_request

    lines = [line for line in EXAMPLES.read_text().splitlines() if line.strip()][:limit]
    groups = []
    for line in lines:
        encoded = renderer.encode(parse_decision_request(json.loads(line)["request"]))
        groups.append(([q.prompt_ids for q in encoded], [q.label_ids for q in encoded]))
    return groups


def flatten(groups: list) -> list:
    """Every question of ``groups`` as ``(prompt, labels)``, in order."""
    return [(p, labels) for prompts, label_lists in groups for p, labels in zip(prompts, label_lists)]
