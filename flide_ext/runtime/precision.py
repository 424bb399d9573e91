"""The residual stream's dtype, by name: what the server's ``--residual-dtype``
and the engine's ``residual_dtype`` take. No torch import at module level: the
server's flag check imports this module before torch."""

from __future__ import annotations

RESIDUAL_DTYPES = ("float32", "model")


def parse_residual_dtype(name):
    """``"float32"`` (or ``torch.float32``) -> ``torch.float32``; ``"model"`` ->
    None (the residual stream in the model's dtype, as a plain forward).

    Raises:
        ValueError: anything else.
    """
    import torch

    if name is torch.float32:
        return name
    if not isinstance(name, str) or name not in RESIDUAL_DTYPES:
        raise ValueError(f"residual dtype {name!r} is not one of {', '.join(RESIDUAL_DTYPES)} (or torch.float32)")
    return torch.float32 if name == "float32" else None
