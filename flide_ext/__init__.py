"""Flide: exact forked decision inference for SGLang.

One shared state, many questions answered by single-token labels, computed as
one flat token stream in which every question sees exactly its own prompt.
"""

from .protocol.errors import FlideError, ModelLoadError, RequestError
from .plan.flat import FlatPlan, plan_round
from .protocol.token_requests import TokenAnswer, TokenRequest
from .runtime.engine import Engine, RoundStats
from .runtime.rounds import RoundCapacity

__all__ = [
    "Engine",
    "FlatPlan",
    "FlideError",
    "ModelLoadError",
    "RequestError",
    "RoundCapacity",
    "RoundStats",
    "TokenAnswer",
    "TokenRequest",
    "plan_round",
]
__version__ = "0.1.0"

try:  # sgl.decide for SGLang's frontend language, where SGLang is installed
    from .entrypoints.lang import register as _register_decide

    _register_decide()
except ImportError:  # pragma: no cover - SGLang's frontend is part of the set-up
    pass
