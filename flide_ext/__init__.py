"""Flide: exact forked decision inference for SGLang.

One shared state, many questions answered by single-token labels, computed as
one flat token stream in which every question sees exactly its own prompt.
"""

from .protocol.errors import FlideError, ModelLoadError, RequestError
from .plan.flat import FlatPlan, plan_round
from .protocol.token_requests import TokenAnswer, TokenRequest
from .runtime.capacity import RoundCapacity
from .runtime.engine import Engine
from .runtime.round_result import BatchAnswers, RoundResult, RoundStats
from .version import __version__

__all__ = [
    "BatchAnswers",
    "Engine",
    "FlatPlan",
    "FlideError",
    "ModelLoadError",
    "RequestError",
    "RoundCapacity",
    "RoundResult",
    "RoundStats",
    "TokenAnswer",
    "TokenRequest",
    "__version__",
    "plan_round",
]

try:  # sgl.decide for SGLang's frontend language, where SGLang is installed
    from .entrypoints.lang import register as _register_decide

    _register_decide()
except ImportError:  # pragma: no cover - SGLang's frontend is part of the set-up
    pass
