"""The residual stream's dtype, by name: what the server's ``--residual-dtype``
and the engine's ``residual_dtype`` take. No torch import at module level: the
server checks the flag before it loads any model code."""

from __future__ import annotations

RESIDUAL_DTYPES = ("float32", "model")


def parse_residual_dtype(name: str):
    """``"float32"`` -> ``torch.float32``; ``"model"`` -> None (the residual
    stream in the model's dtype, as a plain forward).

    Raises:
        ValueError: any other name.
    """
    if name not in RESIDUAL_DTYPES:
        raise ValueError(f"residual dtype {name!r} is not one of {', '.join(RESIDUAL_DTYPES)}")
    import torch

    return torch.float32 if name == "float32" else None
