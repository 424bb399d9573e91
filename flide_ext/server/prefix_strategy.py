"""``--execution-strategy prefix_cache``: the server answers each request the way
today's serving engines do, for comparison with Flide's forked rounds over HTTP
(the ``prefix_cache`` strategy of :mod:`flide_ext.runtime.strategies`, here
through the scheduler and its state cache).

The request's state (its prompts' shared prefix, cut to a checkpoint position,
:func:`~flide_ext.runtime.strategies.cached_length`) is computed first, as a
request of its own one token longer, which leaves its checkpoint in the state
cache; then every question is sent as its own one-prompt request, all at once,
and each resumes from that checkpoint and recomputes the rest of its prompt.
Each question's answer has the bits it has under the ``flide`` strategy: a
question's result does not depend on its round or on resuming from a checkpoint.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Awaitable, Callable, List

if TYPE_CHECKING:
    from .io_struct import ScoreDone

#: The strategies a server runs (``--execution-strategy``); the first is the default.
SERVED_STRATEGIES = ("flide", "prefix_cache")

ScoreRound = Callable[..., Awaitable["ScoreDone"]]


async def score_question_by_question(score_round: ScoreRound, prompts: List, labels: List[List[int]],
                                     field: str, over_labels: bool) -> ScoreDone:
    """One request's answers under ``prefix_cache``: ``score_round(prompts, labels,
    field, over_labels)`` (one request to the scheduler) for the state, then for
    each question alone, concurrently.

    Returns:
        One :class:`ScoreDone` as for the whole request: every question's label
        log-probabilities in order; ``stream_tokens`` everything computed, the
        state's request included; ``cached_tokens`` summed over the questions;
        ``round_requests`` the largest round's; no ``stages`` (the requests overlap).

    Raises:
        As ``score_round``, for the first request that fails; the others still run.
    """
    # Imported here: the plan's imports (torch) stay out of `flide --help`, which reads this module's names.
    from ..runtime.strategies import cached_length
    from .io_struct import ScoreDone

    state_tokens = 0
    cached = cached_length(prompts)
    if cached > 0:
        state = await score_round([prompts[0][:cached + 1]], [labels[0][:1]], field, True)
        state_tokens = state.stream_tokens
    dones = await asyncio.gather(*(score_round([p], [l], field, over_labels) for p, l in zip(prompts, labels)))
    return ScoreDone(rid=dones[0].rid, label_logprobs=[d.label_logprobs[0] for d in dones],
                     stream_tokens=state_tokens + sum(d.stream_tokens for d in dones),
                     round_requests=max(d.round_requests for d in dones),
                     cached_tokens=sum(d.cached_tokens for d in dones), cache=dones[-1].cache)
