"""Flat streams shaped like the decision workloads RACE (Lai et al., 2017), QuALITY
(Pang et al., 2022) and MultiRC (Khashabi et al., 2018), with lengths from those
datasets' papers and cards in Qwen tokens: seeded random token ids of the right
lengths, one prefix tree per request."""

from __future__ import annotations

import torch

# name: (state tokens, questions per state, question tokens, requests per round)
WORKLOADS = {
    "race": (375, 4, 90, 16),  # ~3.5 questions of ~90 tokens (chat-template suffix) per ~375-token passage
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
