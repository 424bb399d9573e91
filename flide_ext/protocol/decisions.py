"""SGLang ``/v1/decisions`` requests: rendering with SGLang's own code, answers in
SGLang's own response models.

Each question's prompt is built exactly as SGLang's per-question path builds it
(``sglang.srt.entrypoints.openai.serving_decisions``): ``render_question`` wording,
the tokenizer's chat template with the generation prompt and reasoning turned
off, tokenised without special tokens, and labels checked to be one distinct
token each after the prompt. Image inputs are not served.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List
import warnings

with warnings.catch_warnings():
    # SGLang's import chain warns that GPU quantisation kernels are absent on CPU;
    # Flide uses none of them.
    warnings.filterwarnings("ignore", message="Only CUDA", category=UserWarning)
    from sglang.srt.entrypoints.openai import serving_decisions as sgl_decisions
    from sglang.srt.entrypoints.openai.protocol import DecisionRequest, DecisionResponse, UsageInfo
    from sglang.srt.managers.tokenizer_manager_score_mixin import TokenizerManagerScoreMixin
    from sglang.srt.parser.template_detection import detect_reasoning_pattern

from .errors import RequestError, validate_model

PROMPT_FORMAT_VERSION = sgl_decisions.PROMPT_FORMAT_VERSION
# Full-vocabulary probability of all labels: math.fsum of exp(logprob), SGLang's own.
label_mass = sgl_decisions.label_mass


@dataclass
class EncodedQuestion:
    """One question's full prompt ids and label ids, in SGLang's candidate order."""

    prompt_ids: List[int]
    label_ids: List[int]


def parse_decision_request(obj: Any) -> DecisionRequest:
    """Validate a dict (or DecisionRequest) with SGLang's ``DecisionRequest`` model.

    Raises:
        RequestError: naming the first offending field, e.g. ``questions``
            for repeated ids or ``questions[1].options`` for too many options.
    """
    if isinstance(obj, DecisionRequest):
        return obj
    return validate_model(DecisionRequest, obj, tags=("choice", "score", "yes_no"))


def _check_text(value: Any, field: str) -> None:
    """Raise RequestError unless ``value`` renders (as SGLang renders it) to text
    that UTF-8 can encode."""
    try:
        sgl_decisions.render_text(value).encode("utf-8")
    except (TypeError, ValueError, RecursionError, UnicodeEncodeError) as e:
        raise RequestError(field, f"cannot be rendered as UTF-8 text: {type(e).__name__}: {e}") from None


def check_texts(request: DecisionRequest) -> None:
    """Check every text field of a request before it is rendered.

    Raises:
        RequestError: naming the first field that is not renderable text (a lone
            surrogate, a value JSON cannot hold, a cycle, nesting too deep).
    """
    _check_text(request.input, "input")
    for i, q in enumerate(request.questions):
        _check_text(q.id, f"questions[{i}].id")
        _check_text(q.question, f"questions[{i}].question")
        for j, option in enumerate(getattr(q, "options", None) or []):
            _check_text(option.name, f"questions[{i}].options[{j}].name")
            _check_text(option.description, f"questions[{i}].options[{j}].description")
        for j, level in enumerate(getattr(q, "levels", None) or []):
            _check_text(level, f"questions[{i}].levels[{j}]")
        for side in ("yes", "no"):
            if hasattr(q, side):
                _check_text(getattr(q, side), f"questions[{i}].{side}")


def label_probabilities(label_logprobs: List[float], temperature: float) -> List[float]:
    """Label probabilities renormalised over the labels, as SGLang's scorer computes
    them: ``softmax((logprob - max) / temperature)`` in Python floats."""
    ids = list(range(len(label_logprobs)))
    return TokenizerManagerScoreMixin._convert_logprobs_to_scores(
        None, dict(zip(ids, label_logprobs)), ids, True, temperature
    )


class DecisionRenderer:
    """Turns DecisionRequests into per-question prompt ids, and scores into
    DecisionResponses, for one tokenizer.

    Args:
        tokenizer: a transformers tokenizer with a chat template.
        context_length: the model's context length in tokens.
    """

    def __init__(self, tokenizer, context_length: int):
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.added_tokens = {i: t for t, i in tokenizer.get_added_vocab().items()}
        self.always_reasons, config = detect_reasoning_pattern(getattr(tokenizer, "chat_template", None))
        self.reasoning_toggle = config.toggle_param if config is not None else None

    def _chat_template_kwargs(self, request: DecisionRequest) -> Dict[str, Any]:
        kwargs = {}
        if self.reasoning_toggle is not None:
            kwargs[self.reasoning_toggle] = False
        kwargs.update(request.chat_template_kwargs)
        return kwargs

    def _check(self, request: DecisionRequest) -> None:
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise RequestError("model", "this model's tokenizer has no chat template, which decisions need")
        if request.images:
            raise RequestError("images", "image inputs are not served by Flide")
        version = request.prompt_format_version
        if version is not None and version != PROMPT_FORMAT_VERSION:
            raise RequestError(
                "prompt_format_version",
                f"{version} is not served, this server uses version {PROMPT_FORMAT_VERSION}",
            )
        if self.always_reasons:
            raise RequestError("model", "chat templates that always reason before answering are not supported")
        toggle = self.reasoning_toggle
        kwargs = request.chat_template_kwargs
        if toggle in kwargs and kwargs[toggle] is not False:
            raise RequestError(
                f"chat_template_kwargs.{toggle}", f"is {kwargs[toggle]!r}, but decisions need it false or unset"
            )

    def encode(self, request: DecisionRequest) -> List[EncodedQuestion]:
        """Prompt and label ids for each question, in request order.

        Raises:
            RequestError: the request cannot be rendered (a label that is not one
                token, a prompt over the context length, a bad chat template, ...).
        """
        self._check(request)
        check_texts(request)
        text = sgl_decisions.render_text(request.input)
        kwargs = self._chat_template_kwargs(request)
        out = []
        for i, question in enumerate(request.questions):
            view = sgl_decisions._decision_view(question)
            labels = sgl_decisions.default_labels(view)
            content = sgl_decisions.render_question(text=text, view=view, labels=labels)
            try:
                prompt = self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": content}],
                    tokenize=False,
                    add_generation_prompt=True,
                    **kwargs,
                )
            except Exception as e:  # jinja raises many kinds; all are the request's
                raise RequestError("chat_template_kwargs", f"the chat template failed: {e}") from None
            try:
                prompt_ids = self.tokenizer.encode(prompt, add_special_tokens=False)
            except (TypeError, ValueError) as e:
                raise RequestError("input", f"the prompt of question {question.id!r} cannot be tokenised: {e}") from None
            if not prompt_ids:
                raise RequestError("chat_template_kwargs", "the chat template rendered an empty prompt")
            if len(prompt_ids) >= self.context_length:
                raise RequestError(
                    "input",
                    f"the prompt of question {question.id!r} has {len(prompt_ids)} tokens, which does not fit "
                    f"the context length of {self.context_length} tokens",
                )
            try:
                label_ids = sgl_decisions._encode_labels(
                    tokenizer=self.tokenizer,
                    prompt=prompt,
                    prompt_ids=prompt_ids,
                    labels=labels,
                    added_tokens=self.added_tokens,
                )
            except ValueError as e:
                raise RequestError(f"questions[{i}]", f"question {question.id!r}: {e}") from None
            out.append(EncodedQuestion(prompt_ids, label_ids))
        # Their prefix tree's depth is checked where the tree is built, once
        # (runtime.rounds.request_size, naming "questions").
        return out

    def respond(
        self,
        request: DecisionRequest,
        encoded: List[EncodedQuestion],
        label_logprobs: List[List[float]],
    ) -> DecisionResponse:
        """Build SGLang's DecisionResponse from each question's label log-probabilities
        (full vocabulary, in label order)."""
        answers = {}
        for question, enc, logprobs in zip(request.questions, encoded, label_logprobs):
            answer = sgl_decisions._build_answer(
                question=question,
                view=sgl_decisions._decision_view(question),
                probabilities=label_probabilities(logprobs, request.temperature),
                token_logprobs=logprobs,
            )
            if request.return_prompt_token_ids:
                answer.prompt_token_ids = enc.prompt_ids
                answer.label_token_ids = enc.label_ids
            answers[question.id] = answer
        prompt_tokens = sum(len(e.prompt_ids) for e in encoded)
        return DecisionResponse(
            model=request.model,
            prompt_format_version=PROMPT_FORMAT_VERSION,
            answers=answers,
            usage=UsageInfo(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens),
        )
