"""Rotary position embedding (Su et al., 2021, "RoFormer", arXiv:2104.09864) at
logical positions: each token rotates by its index in its own prompt, not by its
row in the flat stream."""

from __future__ import annotations

from typing import Optional

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


def _rope_parameters(config, layer_type: Optional[str]) -> dict:
    params = getattr(config, "rope_parameters", None) or {}
    if layer_type is not None:
        params = params[layer_type]
    if not params and getattr(config, "rope_theta", None) is not None:
        params = {"rope_type": "default", "rope_theta": config.rope_theta}
    return params


class RotaryEmbedding:
    """Cos/sin tables for rotating the first ``rotary_dim`` features of each head.

    The frequencies come from the model's Hugging Face config (``rope_parameters``:
    ``rope_theta``, ``rope_type`` and its scaling fields, ``partial_rotary_factor``),
    computed by transformers' own ``ROPE_INIT_FUNCTIONS`` for scaled types, whose
    frequency count sets ``rotary_dim`` (Gemma 4's ``"proportional"`` type gives
    one per feature pair of the whole head, zero past the rotated share: those
    features rotate by the identity, as in the checkpoint's own forward).

    Args:
        config: the model's transformers config.
        head_dim: the head size the tables rotate (the default type's).
        layer_type: read ``rope_parameters[layer_type]`` (configs with one set
            per layer type, as Gemma 4's, whose ``"default"`` type rotates the
            whole head even beside a ``partial_rotary_factor``); None:
            ``rope_parameters`` itself.
    """

    def __init__(self, config, head_dim: int, device: torch.device | str = "cpu", layer_type: Optional[str] = None):
        # Built on an explicit device (not the ambient one) so a model built on
        # the meta device still gets real frequency tables.
        params = _rope_parameters(config, layer_type)
        rope_type = params.get("rope_type", "default")
        factor = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
        if layer_type is not None and rope_type == "default":
            factor = 1.0  # Gemma 4's own default rotary turns the whole head, whatever the factor says
        self.rotary_dim = int(head_dim * factor)
        if rope_type == "default":
            theta = params.get("rope_theta", 10000.0)
            exponent = torch.arange(0, self.rotary_dim, 2, dtype=torch.int64, device=device).float()
            self.inv_freq = 1.0 / (theta ** (exponent / self.rotary_dim))
            self.attention_scaling = 1.0
        else:
            init = ROPE_INIT_FUNCTIONS[rope_type]
            with torch.device(device):  # transformers makes some tensors on the ambient device
                if layer_type is None:
                    inv_freq, self.attention_scaling = init(config, device)
                else:
                    inv_freq, self.attention_scaling = init(config, device, layer_type=layer_type)
            self.inv_freq = inv_freq.float()
            self.rotary_dim = 2 * self.inv_freq.numel()

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions`` ``[T]`` int64 -> cos, sin ``[T, rotary_dim]`` in ``dtype``."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos = (emb.cos() * self.attention_scaling).to(dtype)
        sin = (emb.sin() * self.attention_scaling).to(dtype)
        return cos, sin
