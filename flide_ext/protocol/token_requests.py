"""The low-level request form: prompts as token ids plus label token ids.

This is what ``/v1/score`` and ``sgl.decide`` reduce to, and what the engine
runs: a request is a group of full prompts that may fork from each other.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Union

import numpy as np

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from .errors import RequestError, validate_model


class TokenRequest(BaseModel):
    """Prompts of one request, each scored at its last token.

    Attributes:
        prompts: full prompt token ids, one list per question (each non-empty).
        label_token_ids: candidate label ids, shared by all prompts or one list per prompt.
        temperature: scales the renormalised label probabilities only.
        checkpoint: accepted for compatibility and ignored: with the state cache
            on, every request's state is kept (at its last checkpoint position)
            and later requests extending it compute only their new tokens.
    """

    model_config = ConfigDict(extra="forbid")

    prompts: List[List[StrictInt]] = Field(min_length=1)
    label_token_ids: Union[List[StrictInt], List[List[StrictInt]]]
    temperature: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    checkpoint: bool = False

    def labels_for(self, i: int) -> List[int]:
        labels = self.label_token_ids
        return labels[i] if labels and isinstance(labels[0], list) else labels  # type: ignore[return-value]


class TokenAnswer(BaseModel):
    """Answers to a TokenRequest, one entry per prompt.

    Attributes:
        label_logprobs: full-vocabulary log-probability of each label (float32 math).
        probabilities: label probabilities renormalised over the labels, with temperature.
        label_mass: full-vocabulary probability of all labels together.
        prompt_tokens: sum of the prompts' lengths.
        resumed_tokens: state tokens resumed from the state cache instead of
            recomputed (its cached tokens).
        checkpoint_tokens: tokens of the new checkpoint this request left in the
            state cache (0: none new).
    """

    label_logprobs: List[List[float]]
    probabilities: List[List[float]]
    label_mass: List[float]
    prompt_tokens: int
    resumed_tokens: int = 0
    checkpoint_tokens: int = 0


def parse_token_request(obj) -> TokenRequest:
    """Validate a dict (or TokenRequest) as a TokenRequest.

    Raises:
        RequestError: naming the first offending field.
    """
    if isinstance(obj, TokenRequest):
        obj = obj.model_dump()  # fields may have been assigned after validation
    return validate_model(TokenRequest, obj)


def check_prompts(prompts: Sequence, vocab_size: Optional[int], context_length: int, field: str = "prompts") -> None:
    """Check prompts (token-id lists or ``[n]`` integer arrays) against a model's
    vocabulary and context; their prefix tree's depth is checked where it is
    built (:func:`flide_ext.runtime.rounds.request_size`). ``vocab_size`` None:
    the ids were checked already (only emptiness and length are checked).

    Raises:
        RequestError: on ``field[i]``: an empty prompt, a prompt of
            ``context_length`` tokens or more, or an id outside ``[0, vocab_size)``.
    """
    for i, prompt in enumerate(prompts):
        name = f"{field}[{i}]"
        if len(prompt) == 0:
            raise RequestError(name, "is empty; a prompt needs at least one token")
        if len(prompt) >= context_length:
            raise RequestError(
                name, f"has {len(prompt)} tokens, which does not fit the context length of {context_length} tokens"
            )
        if vocab_size is None:
            continue
        low, high = (int(prompt.min()), int(prompt.max())) if isinstance(prompt, np.ndarray) else (min(prompt), max(prompt))
        if low < 0 or high >= vocab_size:  # C loops; the first bad id only when there is one
            bad = next(int(t) for t in prompt if not 0 <= t < vocab_size)
            raise RequestError(name, f"token id {bad} is outside the vocabulary [0, {vocab_size})")


def check_labels(labels: Sequence, num_prompts: int, vocab_size: int) -> None:
    """Check ``label_token_ids``: one list shared by all prompts, or one per prompt.

    Raises:
        RequestError: an empty, repeated or out-of-range label list, or per-prompt
            labels whose count differs from the prompts'.
    """
    per_prompt = bool(labels) and isinstance(labels[0], list)
    if per_prompt and len(labels) != num_prompts:
        raise RequestError(
            "label_token_ids",
            f"has {len(labels)} lists for {num_prompts} prompts; give one list per prompt or one shared list",
        )
    for i, ids in enumerate(labels if per_prompt else [labels]):
        field = f"label_token_ids[{i}]" if per_prompt else "label_token_ids"
        if not ids:
            raise RequestError(field, "is empty; give at least one label token id")
        if len(set(ids)) != len(ids):
            raise RequestError(field, "repeats a label token id")
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise RequestError(field, f"token id {bad} is outside the vocabulary [0, {vocab_size})")


def check_token_request(request: TokenRequest, vocab_size: int, context_length: int) -> None:
    """Check a TokenRequest against a model's vocabulary and context
    (:func:`check_prompts`, then :func:`check_labels`; its tree's depth is
    checked when the request is sized for a round).

    Raises:
        RequestError: naming the first offending field.
    """
    check_prompts(request.prompts, vocab_size, context_length)
    check_labels(request.label_token_ids, len(request.prompts), vocab_size)
