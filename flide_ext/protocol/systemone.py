"""System One API 0.2.0 (``/v1/systemone``): rendered by SGLang's own handler.

SGLang's ``SystemOneServing`` renders each question (its views, labels, two-letter
labels past 26 options, legend checks) and builds each answer (noul probability,
choice with confidence, expected score with legend). Flide drives that handler
with the few tokenizer-manager facts it reads, so every prompt id is the one
SGLang's per-question path would build, and scores the prompts as one forked round.
Image inputs are not served.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any, List, Tuple

from .decisions import DecisionRenderer, EncodedQuestion, _check_text, label_mass, label_probabilities
from .errors import RequestError, validate_model

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Only CUDA", category=UserWarning)
    from sglang.srt.entrypoints.systemone import serving as sgl_systemone
    from sglang.srt.entrypoints.systemone.protocol import SystemOneRequest, SystemOneResponse, SystemOneUsage


class SystemOneRenderer:
    """SystemOneRequests -> per-question prompt ids, and label log-probabilities ->
    SystemOneResponses, for the tokenizer of a DecisionRenderer.

    Args:
        renderer: the model's DecisionRenderer (tokenizer, context length, reasoning toggle).
        served_model_name: the ``model`` every response names.
    """

    def __init__(self, renderer: DecisionRenderer, served_model_name: str):
        self.renderer = renderer
        self.served_model_name = served_model_name
        handler = sgl_systemone.SystemOneServing.__new__(sgl_systemone.SystemOneServing)
        handler.tokenizer_manager = SimpleNamespace(
            tokenizer=renderer.tokenizer,
            context_len=renderer.context_length,
            num_reserved_tokens=0,
            mm_processor=None,
            served_model_name=served_model_name,
        )
        handler.added_tokens = renderer.added_tokens
        handler.reasoning_markers = None  # those checks only refuse templates
        handler.reasoning_toggle = renderer.reasoning_toggle
        handler.default_chat_template_kwargs = {}
        handler.decision_config = handler.joint_head_config = handler.pointer_head = None
        self.handler = handler

    @staticmethod
    def parse(body: Any) -> SystemOneRequest:
        """Validate with SGLang's ``SystemOneRequest``. Raises RequestError naming the field."""
        return validate_model(SystemOneRequest, body, tags=("noul", "choice", "score"))

    def encode(self, request: SystemOneRequest) -> Tuple[list, List[EncodedQuestion]]:
        """Views and prompt/label ids of each question, in request order.

        Raises:
            RequestError: images, a reasoning toggle left on, unrenderable text, a label
                that is not one token, a prompt over the context length.
        """
        if request.images:
            raise RequestError("images", "image inputs are not served by Flide")
        toggle = self.renderer.reasoning_toggle
        kwargs = request.chat_template_kwargs
        if toggle in kwargs and kwargs[toggle] is not False:
            raise RequestError(f"chat_template_kwargs.{toggle}", f"is {kwargs[toggle]!r}, but decisions need it false or unset")
        check_texts_of(request)
        views = [sgl_systemone._view(q) for q in request.questions.values()]
        encoded: List[EncodedQuestion] = []
        try:
            for prompt_ids, label_ids, _images in self.handler._encoded_systemone_questions(request, views):
                if not prompt_ids:
                    raise RequestError("chat_template_kwargs", "the chat template rendered an empty prompt")
                encoded.append(EncodedQuestion(prompt_ids, label_ids))
        except ValueError as e:
            message = str(e)
            qid = list(request.questions)[len(encoded)]
            field = "state" if "context length" in message else f"questions.{qid}"
            raise RequestError(field, message) from None
        except TypeError as e:  # the tokenizer refuses text (e.g. a lone surrogate)
            raise RequestError("state", f"cannot be tokenised: {e}") from None
        return views, encoded

    def respond(self, request: SystemOneRequest, views: list, encoded: List[EncodedQuestion],
                label_logprobs: List[List[float]]) -> SystemOneResponse:
        answers = {}
        for (qid, _), view, logprobs in zip(request.questions.items(), views, label_logprobs):
            answers[qid] = sgl_systemone._answer(
                view=view, probabilities=label_probabilities(logprobs, 1.0), mass=label_mass(logprobs), question_id=qid
            )
        tokens = sum(len(e.prompt_ids) for e in encoded)
        return SystemOneResponse(model=self.served_model_name, answers=answers, usage=SystemOneUsage(input_tokens=tokens))


def check_texts_of(request: SystemOneRequest) -> None:
    """Every text field renders to UTF-8 text (see decisions.check_texts).

    Raises:
        RequestError: naming the first field that does not.
    """
    _check_text(request.state, "state")
    for qid, q in request.questions.items():
        _check_text(qid, f"questions.{qid}")
        _check_text(q.instructions, f"questions.{qid}.instructions")
        criteria = q.criteria
        if isinstance(criteria, dict):
            for name, value in criteria.items():
                _check_text(name, f"questions.{qid}.criteria")
                _check_text(value, f"questions.{qid}.criteria.{name}")
        elif isinstance(criteria, list):
            for j, value in enumerate(criteria):
                _check_text(value, f"questions.{qid}.criteria[{j}]")
        elif criteria is not None:
            _check_text(criteria.true, f"questions.{qid}.criteria.true")
            _check_text(criteria.false, f"questions.{qid}.criteria.false")
