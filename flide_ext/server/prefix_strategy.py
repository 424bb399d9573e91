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

ScorePart = Callable[..., Awaitable["ScoreDone"]]


async def score_question_by_question(score_part: ScorePart, prompts: List, labels: List[List[int]], field: str,
                                     over_labels: bool, clock=None, metrics=None) -> "ScoreDone":
    """One client request's answers under ``prefix_cache``: ``score_part(prompts,
    labels, field, over_labels)`` (one scheduler request, neither timed nor
    counted as a client's) for the state, then for each question alone, concurrently.

    Args:
        clock: the HTTP request's :class:`~.metrics.RequestClock` (None: untimed):
            its ``tokenize`` stage ends when the parts are sent, its ``transport``
            stage holds them all (they overlap: no scheduler stage is the request's).
        metrics: the server's :class:`~.metrics.Metrics`: the request's prompt
            tokens counted once, with everything its parts computed and resumed.

    Returns:
        One :class:`ScoreDone` as for the whole request: every question's label
        log-probabilities in order; ``stream_tokens`` everything computed, the
        state's request included; ``cached_tokens`` summed over the questions;
        ``round_requests`` the largest round's.

    Raises:
        As ``score_part``, for the first part that fails (the others still run);
        a refused state names the request's field and says it was the state.
    """
    # Imported here: the plan's imports (torch) stay out of `flide --help`, which reads this module's names.
    from ..protocol.errors import RequestError
    from ..runtime.strategies import cached_length
    from .io_struct import ScoreDone

    if clock is not None:
        clock.lap("tokenize")
    state_tokens = 0
    cached = cached_length(prompts)
    if cached > 0:
        try:
            state = await score_part([prompts[0][:cached + 1]], [labels[0][:1]], field, True)
        except RequestError as e:
            raise RequestError(e.field, f"the request's shared state ({cached + 1} tokens, run first under "
                                        f"--execution-strategy prefix_cache): {e.message}") from None
        state_tokens = state.stream_tokens
    dones = await asyncio.gather(*(score_part([p], [l], field, over_labels) for p, l in zip(prompts, labels)))
    done = ScoreDone(rid=dones[0].rid, label_logprobs=[d.label_logprobs[0] for d in dones],
                     stream_tokens=state_tokens + sum(d.stream_tokens for d in dones),
                     round_requests=max(d.round_requests for d in dones),
                     cached_tokens=sum(d.cached_tokens for d in dones), cache=dones[-1].cache)
    if clock is not None:
        clock.lap("transport")
    if metrics is not None:
        metrics.tokens(sum(len(p) for p in prompts), done.stream_tokens, done.cached_tokens)
    return done
