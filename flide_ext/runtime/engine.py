"""The Engine: load a model once, answer rounds of decision requests.

A batch of requests is one round: all their prompts are merged into one prefix
tree (per request) and run as one flat stream, with one readout row per distinct
prompt. A request that cannot be answered gets a :class:`RequestError` in its
place and is left out of the round; the others are answered as if it had never
been sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Union

import torch

from ..builtin_models import resolve_model_path
from ..errors import ModelLoadError, RequestError
from ..models.loader import load_model
from ..plan import plan_round
from ..requests import TokenAnswer, TokenRequest, check_token_request, parse_token_request

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class RoundStats:
    """What one round computed.

    Attributes:
        requests: requests answered in the round.
        questions: prompts answered (one per question).
        prompt_tokens: sum of every question's full prompt length (what one
            sequence per question would compute).
        stream_tokens: tokens in the flat stream (what Flide computed).
        segments: segments in the prefix tree.
        levels: depth of the deepest tree + 1.
    """

    requests: int = 0
    questions: int = 0
    prompt_tokens: int = 0
    stream_tokens: int = 0
    segments: int = 0
    levels: int = 0

    @property
    def tokens_saved(self) -> int:
        return self.prompt_tokens - self.stream_tokens


class Engine:
    """Flide's decision engine over one model.

    Args:
        model_path: a Hugging Face checkpoint directory (config.json + safetensors)
            or a built-in model name (``smollm2-135m``).
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (or a torch dtype).
        device: torch device for weights and compute (``"cpu"``, ``"cuda"``).
        context_length: longest prompt, in tokens, accepted (exclusive); defaults to
            and may not exceed the model's ``max_position_embeddings``.
        tokenizer_path: tokenizer directory, if not the model's own.

    Raises:
        ModelLoadError: the model cannot be found or loaded.
        ValueError: an unknown dtype.
    """

    def __init__(
        self,
        model_path: str,
        dtype: Union[str, torch.dtype] = "float32",
        device: Union[str, torch.device] = "cpu",
        context_length: Optional[int] = None,
        tokenizer_path: Optional[str] = None,
    ):
        if isinstance(dtype, str):
            if dtype not in _DTYPES:
                raise ValueError(f"dtype {dtype!r} is not one of {', '.join(_DTYPES)}")
            dtype = _DTYPES[dtype]
        self.path = resolve_model_path(model_path)
        self.device = torch.device(device)
        self.dtype = dtype
        self.model, self.config = load_model(self.path, dtype, self.device)
        self.vocab_size = int(self.config.vocab_size)
        limit = int(getattr(self.config, "max_position_embeddings", 0) or 1 << 30)
        self.context_length = min(context_length or limit, limit)
        self.tokenizer_path = tokenizer_path or str(self.path)
        self._renderer = None
        self.last_round = RoundStats()

    @property
    def renderer(self):
        """The DecisionRenderer for this model's tokenizer (loaded on first use).

        Raises:
            ModelLoadError: the model has no tokenizer.
        """
        if self._renderer is None:
            from transformers import AutoTokenizer

            from ..decisions import DecisionRenderer

            try:
                tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
            except (OSError, ValueError) as e:
                raise ModelLoadError(f"no tokenizer at {self.tokenizer_path!r}: {e}") from e
            self._renderer = DecisionRenderer(tokenizer, self.context_length)
        return self._renderer

    @torch.inference_mode()
    def run_round(self, groups: Sequence[tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]]]):
        """Run one round: each group is one request's ``(prompts, label ids per prompt)``.

        Returns:
            For each group, for each prompt, the full-vocabulary log-probability of
            each of its labels (Python floats from float32 log-softmax).
        """
        requests, prompts, labels = [], [], []
        for r, (group_prompts, group_labels) in enumerate(groups):
            requests += [r] * len(group_prompts)
            prompts += [list(p) for p in group_prompts]
            labels += [list(l) for l in group_labels]
        self.last_round = RoundStats(requests=len(groups), questions=len(prompts))
        if not prompts:
            return [[] for _ in groups]
        plan = plan_round(requests, prompts, self.device)
        logprobs = self.model(plan).cpu()  # [R, vocab]
        rows = plan.prompt_readout.tolist()
        answers: List[List[List[float]]] = [[] for _ in groups]
        for r, row, ids in zip(requests, rows, labels):
            answers[r].append(logprobs[row, ids].tolist())
        self.last_round = RoundStats(
            requests=len(groups),
            questions=len(prompts),
            prompt_tokens=sum(len(p) for p in prompts),
            stream_tokens=plan.num_tokens,
            segments=plan.num_segments,
            levels=plan.num_levels,
        )
        return answers

    # -- low-level form: token ids in, label log-probabilities out ---------------

    def score_tokens(self, request: Union[TokenRequest, dict]) -> TokenAnswer:
        """Answer one TokenRequest. Raises RequestError for bad input."""
        result = self.score_tokens_batch([request])[0]
        if isinstance(result, RequestError):
            raise result
        return result

    def score_tokens_batch(self, requests: Sequence[Any]) -> List[Union[TokenAnswer, RequestError]]:
        """Answer TokenRequests in one round; bad ones get their RequestError in place."""
        from ..decisions import label_mass, label_probabilities

        parsed: List[Union[TokenRequest, RequestError]] = []
        for obj in requests:
            try:
                req = parse_token_request(obj)
                check_token_request(req, self.vocab_size, self.context_length)
                parsed.append(req)
            except RequestError as e:
                parsed.append(e)
        good = [r for r in parsed if isinstance(r, TokenRequest)]
        scored = iter(self.run_round([(r.prompts, [r.labels_for(i) for i in range(len(r.prompts))]) for r in good]))
        out: List[Union[TokenAnswer, RequestError]] = []
        for req in parsed:
            if isinstance(req, RequestError):
                out.append(req)
                continue
            logprobs = next(scored)
            out.append(
                TokenAnswer(
                    label_logprobs=logprobs,
                    probabilities=[label_probabilities(lp, req.temperature) for lp in logprobs],
                    label_mass=[label_mass(lp) for lp in logprobs],
                    prompt_tokens=sum(len(p) for p in req.prompts),
                )
            )
        return out

    # -- SGLang /v1/decisions form ---------------------------------------------

    def decide(self, request: Any):
        """Answer one SGLang DecisionRequest (model or dict) with a DecisionResponse.

        Raises:
            RequestError: naming the offending field.
        """
        result = self.decide_batch([request])[0]
        if isinstance(result, RequestError):
            raise result
        return result

    def decide_batch(self, requests: Sequence[Any]) -> list:
        """Answer DecisionRequests as one round.

        Returns:
            One entry per request, in order: its DecisionResponse, or the
            RequestError that kept it out of the round.
        """
        from ..decisions import parse_decision_request

        renderer = self.renderer
        prepared: list = []
        for obj in requests:
            try:
                req = parse_decision_request(obj)
                prepared.append((req, renderer.encode(req)))
            except RequestError as e:
                prepared.append(e)
        good = [p for p in prepared if not isinstance(p, RequestError)]
        scored = iter(
            self.run_round([([q.prompt_ids for q in enc], [q.label_ids for q in enc]) for _, enc in good])
        )
        out = []
        for item in prepared:
            if isinstance(item, RequestError):
                out.append(item)
            else:
                req, enc = item
                out.append(renderer.respond(req, enc, next(scored)))
        return out
