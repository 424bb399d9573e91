"""Flide's compute kernels, each beside its plain PyTorch reference of the same
signature. The reference is what CPU runs and what tests compare against."""

from .fork_attention import fork_attention, fork_attention_ref

__all__ = ["fork_attention", "fork_attention_ref"]
