"""What every Flide causal LM shares: embedding, rotary tables, the layer loop
over one ForwardContext (which a caller may stop between layers), and selective
readout."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

from ..kernels.dispatch import check_backend
from ..layers.context import ForwardContext
from ..layers.gated_deltanet import GatedDeltaNet
from ..layers.kernel_module import KernelModule
from ..layers.linear import GemmRows, checked_rows
from ..kernels.label_logits import label_logits
from ..layers.readout import head_logprobs, readout_logprobs, readout_normed, soft_capped
from ..layers.rotary import RotaryEmbedding


#: Default residual stream dtype of every model (None: the activations').
RESIDUAL_DTYPE: Optional[torch.dtype] = torch.float32


class ForwardCancelled(Exception):
    """A forward stopped between two layers because its ``cancelled()`` said so.

    Attributes:
        layers_run: layers computed before it stopped.
        layers: the model's layers.
    """

    def __init__(self, layers_run: int, layers: int):
        super().__init__(f"the forward was cancelled after {layers_run} of {layers} layers")
        self.layers_run, self.layers = layers_run, layers


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def pre_norm_block(x: torch.Tensor, residual: Optional[torch.Tensor], ctx, input_norm, mixer, post_norm, mlp):
    """One pre-norm decoder block over the residual stream, its adds inside the
    norms (``norm(x, residual)`` returns ``(normalised, x + residual)``).

    Args:
        x: ``[T, hidden]`` the last block's output (the embeddings, with
            ``residual`` None).
        residual: ``[T, hidden]`` the residual stream before this block, or None.
        ctx: the ForwardContext the mixer reads (its ``residual_dtype``: the
            stream's dtype the embeddings start it in).
        input_norm, mixer, post_norm, mlp: the block's modules (``mixer(h, ctx)``).

    Returns:
        ``(output, residual)``, whose sum is the block's hidden state.
    """
    if residual is None:
        h, residual = input_norm(x), x.to(ctx.residual_dtype or x.dtype)
    else:
        h, residual = input_norm(x, residual)
    h, residual = post_norm(mixer(h, ctx), residual)
    return mlp(h), residual


class FlatCausalLM(nn.Module):
    """Base of the model families. Subclasses build ``self.model`` with
    ``embed_tokens``, ``layers`` (each called as ``layer(x, residual, ctx)``, returning
    ``(x, residual)``) and ``norm``, and
    ``self.lm_head``.

    ``forward(plan, ...)`` returns ``[R, vocab]`` float32 log-probabilities at the
    plan's readout rows (selective readout: the final norm and LM head see only
    those rows), or the normed rows that :meth:`head_logprobs` and
    :meth:`label_logits` (a question normalised over its labels) read.
    """

    #: GDN layer count (hybrid models set it); sizes the engine's state pool.
    num_gdn_layers = 0
    #: False runs the final norm and LM head over every stream row and then
    #: picks the readout rows (the ablation switch; same answers, more work).
    selective_readout = True
    #: The kernel backend every layer's calls pass (:meth:`set_kernel_backend`).
    kernel_backend: Optional[str] = None
    #: The residual stream's dtype when it is wider than the activations'
    #: (:meth:`set_residual_dtype`).
    residual_dtype: Optional[torch.dtype] = RESIDUAL_DTYPE
    #: The row counts this model's GPU GEMMs run at in deterministic mode
    #: (:mod:`flide_ext.runtime.determinism`); None: their own.
    gemm_rows: Optional[GemmRows] = None
    #: Rows per LM head block when ``selective_readout`` is off.
    full_readout_block = 4096
    #: Final logit soft-capping (:func:`~flide_ext.layers.readout.soft_capped`); None: none.
    logit_softcap: Optional[float] = None

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.rotary = self.make_rotary(config)

    @classmethod
    def gpu_gap(cls, config) -> Optional[str]:
        """Why a checkpoint of this family and ``config`` cannot run on a GPU yet
        (None: it can); the loader refuses CUDA devices then."""
        return None

    @property
    def token_vocab_size(self) -> int:
        """Token ids below this are valid in prompts and labels: the vocabulary."""
        return int(self.config.vocab_size)

    def make_rotary(self, config):
        """The rotary tables' maker (:meth:`rope_tables` calls it)."""
        return RotaryEmbedding(config, head_dim_of(config))

    def rope_tables(self, positions: torch.Tensor, dtype: torch.dtype) -> dict:
        """The forward's rotary tables by name (:attr:`~flide_ext.layers.context.ForwardContext.rope`):
        ``{"": (cos, sin)}``, each ``[T, rotary_dim]`` in ``dtype`` at ``positions`` ``[T]``."""
        return {"": self.rotary.cos_sin(positions, dtype)}

    def embed(self, ctx: ForwardContext) -> torch.Tensor:
        """``[T, hidden]`` the stream's input embeddings (models may also fill ``ctx``)."""
        return self.model.embed_tokens(ctx.plan.token_ids)

    def set_kernel_backend(self, backend: Optional[str]) -> None:
        """Make every layer's kernel calls run ``backend`` (:mod:`flide_ext.kernels.dispatch`:
        ``"triton"``, ``"reference"``, or None to pick by device), decided once
        for the model rather than at each call.

        Raises:
            ValueError: an unknown backend.
        """
        check_backend(backend)
        self.kernel_backend = backend
        for module in self.modules():
            if isinstance(module, KernelModule):
                module.backend = backend

    def set_gdn_rule_dtype(self, dtype: Optional[torch.dtype]) -> None:
        """Run every GDN layer's gated delta rule in ``dtype`` (None: the
        activations' dtype; see :class:`~flide_ext.layers.gated_deltanet.GatedDeltaNet`).

        Raises:
            ValueError: a dtype other than None, float32 or float64.
        """
        if dtype not in (None, torch.float32, torch.float64):
            raise ValueError(f"the GDN rule dtype must be float32 or float64 (or None), not {dtype}")
        for module in self.modules():
            if isinstance(module, GatedDeltaNet):
                module.rule_dtype = dtype

    def set_residual_dtype(self, dtype: Optional[torch.dtype]) -> None:
        """Keep the residual stream (the running sum of the blocks' outputs) in
        ``dtype`` when it is wider than the activations' dtype; None: in the
        activations' dtype, as a plain half-precision forward.

        A bf16 stream rounds every block's sum (a ulp of 2^-8 relative, at the
        stream's largest magnitudes); float32 rounds none of them, as serving
        engines keep reductions in float32. The sum is per row, so it keeps a
        question's bits independent of its round.

        Raises:
            ValueError: a dtype other than None or float32.
        """
        if dtype not in (None, torch.float32):
            raise ValueError(f"the residual stream dtype must be float32 (or None: the activations'), not {dtype!r}")
        self.residual_dtype = dtype

    def stream_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The residual stream's dtype beside activations of ``dtype``."""
        return dtype if self.residual_dtype is None else torch.promote_types(dtype, self.residual_dtype)

    @property
    def tied_weights(self) -> dict[str, str]:
        """Parameters that checkpoints may omit because they share another's tensor."""
        if getattr(self.config, "tie_word_embeddings", False):
            return {"lm_head.weight": "model.embed_tokens.weight"}
        return {}

    def checkpoint_name(self, name: str) -> Optional[str]:
        """This model's parameter name for a checkpoint tensor name, or None to skip it."""
        return name

    def hidden_states(self, ctx: ForwardContext, cancelled: Optional[Callable[[], bool]] = None) -> torch.Tensor:
        """Last-layer hidden states ``[T, hidden]`` (before the final norm), in the
        residual stream's dtype (:meth:`stream_dtype`).

        Raises:
            ForwardCancelled: ``cancelled()`` was true before a layer (it is asked
                before each one).
        """
        x, residual = self.embed(ctx), None
        layers = self.model.layers
        for i, layer in enumerate(layers):
            # A layer is the finest step that is the model's own: a cut waits at
            # most one layer (on a GPU, one layer's launches: they run ahead of it).
            if cancelled is not None and cancelled():
                raise ForwardCancelled(i, len(layers))
            x, residual = layer(x, residual, ctx)
        return x if residual is None else x + residual

    def attention_shapes(self) -> list[tuple[int, int, int]]:
        """Per attention layer, in its ``index`` order, ``(Hkv, D, Dv)`` of its
        K/V rows (sizes the engine's K/V pool)."""
        from ..layers.attention import ForkSelfAttention

        # A KV-shared layer (Gemma 4) reads another layer's rows: it has none of its own.
        layers = sorted((m for m in self.modules() if isinstance(m, ForkSelfAttention) and m.owns_kv),
                        key=lambda m: m.index)
        return [(m.num_kv_heads, m.head_dim, m.head_dim) for m in layers]

    def forward(self, plan, state_pool=None, kv_pool=None, cancelled: Optional[Callable[[], bool]] = None,
                normed: bool = False) -> torch.Tensor:
        """Run a round.

        Args:
            plan: the round's FlatPlan (with slots assigned for hybrid models, and
                K/V rows when ``kv_pool`` is given).
            state_pool: the GDN StatePool (hybrid models).
            kv_pool: the :class:`~flide_ext.runtime.kv_pool.KVPool` the stream's
                K/V are written to and the resumed prefixes' are read from, or
                None (the plan then resumes from nothing).
            cancelled: asked before each layer; true stops the forward (None: never).
            normed: stop before the LM head: return the final norm at the readout
                rows, which :meth:`head_logprobs` and :meth:`label_logits` read
                (with ``selective_readout`` on only).

        Returns:
            ``[R, vocab]`` float32 log-softmax at the readout rows, or with
            ``normed`` ``[R, hidden]`` in the LM head's dtype.

        Raises:
            ValueError: ``normed`` with ``selective_readout`` off.
            ForwardCancelled: ``cancelled()`` was true before a layer. What the
                layers before it wrote (the plan's K/V rows and GDN slots) is
                left half done: the caller drops it.
        """
        if normed and not self.selective_readout:
            raise ValueError("a forward stops at the normed readout rows only with selective readout on")
        dtype = self.model.embed_tokens.weight.dtype
        ctx = ForwardContext(plan, self.rope_tables(plan.positions, dtype), state_pool, kv_pool,
                             self.stream_dtype(dtype))
        with checked_rows(self.gemm_rows):
            h = self.hidden_states(ctx, cancelled)
            if not self.selective_readout:
                return self._full_readout(h, plan.readout_rows)
            if normed:
                return readout_normed(h, plan.readout_rows, self.model.norm, self.lm_head)
            return readout_logprobs(h, plan.readout_rows, self.model.norm, self.lm_head, self.logit_softcap)

    def head_logprobs(self, normed: torch.Tensor) -> torch.Tensor:
        """``[R, hidden]`` normed readout rows (:meth:`forward`'s with ``normed``)
        -> ``[R, vocab]`` float32 full-vocabulary log-probabilities, as
        :meth:`forward` computes them (deterministic mode's row counts included)."""
        with checked_rows(self.gemm_rows):
            return head_logprobs(normed, self.lm_head.weight, self.logit_softcap)

    def label_logits(self, normed: torch.Tensor, rows: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The float32 logits of (readout row, label) pairs only
        (:func:`~flide_ext.kernels.label_logits.label_logits`, on this model's
        kernel backend): ``[R, hidden]`` normed rows, ``[P]`` int64 rows and
        labels on their device -> ``[P]`` float32, soft-capped as the full readout."""
        logits = label_logits(normed, self.lm_head.weight, rows, labels, backend=self.kernel_backend)
        return soft_capped(logits, self.logit_softcap)

    def _full_readout(self, h: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        # The LM head over every stream row, as a server without selective readout
        # computes it, in blocks of rows (a whole round's float32 log-probabilities
        # at a 248k vocabulary would not fit in memory), keeping the readout rows.
        block = self.full_readout_block
        out = torch.empty(rows.numel(), self.lm_head.weight.shape[0], dtype=torch.float32, device=h.device)
        for start in range(0, h.shape[0], block):
            stop = min(start + block, h.shape[0])
            inside = ((rows >= start) & (rows < stop)).nonzero().flatten()
            block_rows = torch.arange(start, stop, device=h.device)
            logprobs = readout_logprobs(h, block_rows, self.model.norm, self.lm_head, self.logit_softcap)
            out[inside] = logprobs.index_select(0, rows[inside] - start)
        return out
