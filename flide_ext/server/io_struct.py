"""Messages between the tokenizer manager and the scheduler process."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class ScoreWork:
    """One request's prompts for the next round.

    Attributes:
        rid: request id, unique in the server's lifetime.
        prompts: full prompt token ids, one list per question.
        labels: label token ids per prompt.
        keep_state: keep the request's state as a checkpoint.
    """

    rid: int
    prompts: List[List[int]]
    labels: List[List[int]]
    keep_state: bool = False


@dataclass
class ScoreDone:
    """The scheduler's answer to one ScoreWork.

    Attributes:
        rid: the request's id.
        label_logprobs: per prompt, the full-vocabulary log-probability of each label.
        stream_tokens: tokens of the round's flat stream that belong to this request.
        error: a message when the round failed (the request gets HTTP 500).
    """

    rid: int
    label_logprobs: Optional[List[List[float]]] = None
    stream_tokens: int = 0
    round_requests: int = 0
    error: Optional[str] = None


@dataclass
class SchedulerReady:
    """Sent once the model is loaded."""

    vocab_size: int
    context_length: int
    info: dict = field(default_factory=dict)
