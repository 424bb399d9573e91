"""Flide: exact forked decision inference for SGLang.

One shared state, many questions answered by single-token labels, computed as
one flat token stream in which every question sees exactly its own prompt.
"""

import sys
from importlib import import_module

from .version import __version__

# Public names and the modules that hold them, imported on first use: the HTTP
# process of the server needs none of the engine's (torch, the models), and
# each process start would otherwise pay for them.
_LAZY = {
    "FlideError": ".protocol.errors", "ModelLoadError": ".protocol.errors", "RequestError": ".protocol.errors",
    "FlatPlan": ".plan.flat", "plan_round": ".plan.flat",
    "TokenAnswer": ".protocol.token_requests", "TokenRequest": ".protocol.token_requests",
    "RoundCapacity": ".runtime.capacity",
    "Engine": ".runtime.engine",
    "BatchAnswers": ".runtime.round_result", "RoundResult": ".runtime.round_result",
    "RoundStats": ".runtime.round_result",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


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

# sgl.decide for SGLang's frontend language: registered here when SGLang is
# already imported (``import sglang as sgl`` first, as its programs begin), and
# by importing flide_ext.entrypoints.lang (FlideEndpoint, which runs them)
# otherwise. Importing SGLang here would cost each server process seconds.
if "sglang" in sys.modules:
    from .entrypoints.lang import register as _register_decide

    _register_decide()
