"""Flat streams shaped like the decision workloads RACE (Lai et al., 2017), QuALITY
(Pang et al., 2022) and MultiRC (Khashabi et al., 2018), with lengths from those
datasets' papers and cards in Qwen tokens: seeded random token ids of the right
lengths, one prefix tree per request; and seeded random kernel inputs for them."""

from __future__ import annotations

import torch

# name: (state tokens, questions per state, question tokens, requests per round)
WORKLOADS = {
    "race": (375, 4, 90, 16),  # ~3.5 questions of ~90 tokens (chat-template suffix) per ~375-token passage
    "race_single": (375, 1, 90, 16),  # one RACE question per request: the single-question latency case
    "multirc": (300, 30, 25, 8),  # ~6.5 questions x ~5 options judged true/false, ~300-token paragraph
    "quality": (5000, 18, 40, 2),  # ~5,000-token documents, ~18 questions
}


def workload_prompts(name: str, requests: int | None = None, seed: int = 0, vocab: int = 32000):
    """``(owners, prompts)``: for each prompt its request index and full token ids.

    Raises:
        KeyError: an unknown workload name.
    """
    state_len, questions, question_len, default_requests = WORKLOADS[name]
    gen = torch.Generator().manual_seed(seed)
    owners, prompts = [], []
    for r in range(requests or default_requests):
        state = torch.randint(0, vocab, (state_len,), generator=gen).tolist()
        for i in range(questions):
            question = torch.randint(0, vocab, (question_len,), generator=gen).tolist()
            question[0] = i  # siblings part at the state's end
            owners.append(r)
            prompts.append(state + question)
    return owners, prompts


def per_question_tokens(prompts) -> int:
    """Tokens a per-question server would run: every full prompt."""
    return sum(len(p) for p in prompts)


def attention_inputs(T: int, Hq: int, Hkv: int, D: int, gen: torch.Generator, dtype=torch.bfloat16, prefix: int = 0):
    """Random ``q`` ``[T, Hq, D]`` and ``k``, ``v`` ``[prefix + T, Hkv, D]`` on ``gen``'s device."""
    q = torch.randn(T, Hq, D, generator=gen, device=gen.device).to(dtype)
    k = torch.randn(prefix + T, Hkv, D, generator=gen, device=gen.device).to(dtype)
    v = torch.randn(prefix + T, Hkv, D, generator=gen, device=gen.device).to(dtype)
    return q, k, v


def gdn_inputs(T: int, H: int, HV: int, K: int, V: int, gen: torch.Generator, dtype=torch.bfloat16):
    """Random gated-delta-rule inputs on ``gen``'s device: ``q``, ``k`` ``[T, H, K]``,
    ``v`` ``[T, HV, V]``, log decay ``g`` ``[T, HV]`` float32 in (-0.5, 0], ``beta``
    ``[T, HV]`` in (0, 1)."""
    q = torch.randn(T, H, K, generator=gen, device=gen.device).to(dtype)
    k = torch.randn(T, H, K, generator=gen, device=gen.device).to(dtype)
    v = torch.randn(T, HV, V, generator=gen, device=gen.device).to(dtype)
    g = -torch.rand(T, HV, generator=gen, device=gen.device) * 0.5
    beta = torch.rand(T, HV, generator=gen, device=gen.device).to(dtype)
    return q, k, v, g, beta
