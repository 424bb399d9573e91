"""A round's plan and kernel tables on the device, in one host-to-device copy.

The engine plans a round on the host. Everything the forward pass reads (the
plan's tensors, every kernel's tables) is packed into one pinned byte buffer and
copied with one transfer into a device byte buffer, of which the device tensors
are views. A :class:`RoundBuffers` built for a capacity keeps that device buffer
and its views for its whole life, so a CUDA graph captured over them replays any
later round written into them (:mod:`.graph_runner`).
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Optional

import numpy as np
import torch

from ..kernels.tables import KernelTables, TableCapacity, table_arrays
from ..plan.flat import FlatPlan

# Plan tensors the forward pass reads, padded to a capacity by pad_plan.
_ROW_FIELDS = ("token_ids", "positions", "token_segment", "stream_rows")
_SEGMENT_FIELDS = ("seg_parent", "seg_start", "seg_len", "seg_kv_start", "seg_kv_len", "seg_logical_start",
                   "seg_request", "seg_depth", "seg_slot", "seg_initial_slot")
_ALIGN = 16
# Read on the host only (which readout row answers which prompt).
_HOST_FIELDS = ("prompt_readout",)


def _padding(plan: FlatPlan, capacity: TableCapacity, readouts: int) -> dict:
    # ``{field: (host tensor or None, padded size, fill)}`` of pad_plan, after its checks.
    T, S_all, R = plan.num_tokens, int(plan.seg_start.numel()), int(plan.readout_rows.numel())
    if T > capacity.tokens or S_all > capacity.segments or plan.num_levels > capacity.levels or R > readouts:
        raise ValueError(f"a round of {T} tokens, {S_all} segments, {plan.num_levels} levels and {R} readout "
                         f"rows does not fit {capacity} with {readouts} readout rows")
    if plan.num_prefix_rows and plan.kv_index is None:
        raise ValueError("a round resuming from checkpoints is padded only with its K/V rows in a pool")
    fill = {"token_ids": 0, "positions": 0, "token_segment": capacity.segments, "seg_start": T, "seg_parent": -1,
            "seg_request": -1, "seg_depth": -1, "seg_slot": -1, "seg_initial_slot": -1, "stream_rows": plan.kv_scratch}
    out = {name: (getattr(plan, name), capacity.tokens, fill[name]) for name in _ROW_FIELDS}
    for name in _SEGMENT_FIELDS:
        out[name] = (getattr(plan, name), capacity.segments + 1, fill.get(name, 0))
    # With a K/V pool the key array (kv_index, kv_positions) lives in the graph
    # runner's shared buffer; without one it is the stream's own rows.
    out["kv_positions"] = out["positions"] if plan.kv_index is None else (None, 0, 0)
    out["kv_index"] = (None, 0, 0)
    out["readout_rows"] = (plan.readout_rows, readouts, 0)
    return out


def pad_plan(plan: FlatPlan, capacity: TableCapacity, readouts: int) -> FlatPlan:
    """The plan with its tensors padded to ``capacity`` (host tensors in, host out).

    Padding rows hold token 0 at position 0 in the padding segment (index
    ``capacity.segments``) and write their K/V to the pool's scratch row;
    padding segments have no rows, keys, parent or slots; padding readout rows
    read row 0. ``levels`` stay the round's own. A round with a K/V pool comes
    back without ``kv_index`` and ``kv_positions`` (the graph runner holds them).

    Raises:
        ValueError: the round does not fit (tokens, segments, levels or ``readouts``).
    """
    def grow(t, size, fill):
        return torch.cat([t, torch.full((size - t.numel(),), fill, dtype=t.dtype)]) if t is not None else None

    changes = {name: grow(*padding) for name, padding in _padding(plan, capacity, readouts).items()}
    return replace(plan, _level_tables=None, **changes)


def _layout(named: dict) -> tuple[list, int]:
    entries, offset = [], 0
    for name, t in named.items():
        nbytes = t.numel() * t.element_size()
        entries.append((name, offset, t.dtype, tuple(t.shape)))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return entries, offset


def _named_tensors(plan: FlatPlan, tables: Optional[dict]) -> dict:
    # Every tensor the buffers hold, by name: the plan's (None fields stay out)
    # and the tables' (ForkAttention's tuple of block size B as attentionB_0, attentionB_1, ...).
    named = {}
    for f in fields(FlatPlan):
        value = getattr(plan, f.name)
        if isinstance(value, torch.Tensor) and f.name not in _HOST_FIELDS:
            named[f.name] = value
    if tables is not None:
        for name, value in tables.items():
            if name == "attention":
                for size, att in value.items():
                    for i, t in enumerate(att[1:]):
                        named[f"attention{size}_{i}"] = t
            elif isinstance(value, (torch.Tensor, np.ndarray)):
                named[name] = value
    return named


def _flatten(plan: FlatPlan, tables: Optional[dict], with_levels: bool) -> dict:
    named = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
             for k, v in _named_tensors(plan, tables).items()}
    if with_levels:
        for d, level in enumerate(plan.levels):
            named[f"level{d}"] = level
    return {k: v.contiguous() for k, v in named.items()}


class RoundBuffers:
    """Device views of one round's plan and tables in one device byte buffer.

    Args:
        device: where the buffer lives.

    :meth:`write` packs a host plan (and its tables) into pinned memory and
    copies it in; the first write fixes the layout, and later writes must have
    the same tensor shapes (a capacity's padded rounds do), so the views, and
    graphs captured over them, stay valid.
    """

    def __init__(self, device):
        self.device = torch.device(device)
        self._layout = None
        self._host = self._device = None
        self._views: dict = {}
        self._host_views: dict = {}
        self._copied = None  # CUDA event: the last write's copy has left the pinned buffer

    def write(self, plan: FlatPlan, tables: Optional[dict] = None, with_levels: bool = True) -> FlatPlan:
        """Copy ``plan`` (host tensors) and ``tables`` (:func:`~flide_ext.kernels.tables.table_arrays`
        or :func:`~flide_ext.kernels.tables.build_tables` output) to the device;
        returns the device plan, with ``tables`` as
        :class:`~flide_ext.kernels.tables.KernelTables` when given.

        Raises:
            ValueError: the shapes differ from the buffers' first round.
        """
        named = _flatten(plan, tables, with_levels)
        layout, size = _layout(named)
        if self._layout is None:
            self._layout = layout
            pin = self.device.type == "cuda"
            self._host = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
            self._device = torch.empty(size, dtype=torch.uint8, device=self.device)
            host = self._host.numpy()
            for name, offset, dtype, shape in layout:
                n = torch.Size(shape).numel() * dtype.itemsize
                self._views[name] = self._device[offset:offset + n].view(dtype).view(shape)
                # numpy views of the pinned buffer: a round's few dozen small
                # copies cost a microsecond each instead of a torch dispatch.
                # Dtypes numpy lacks (bfloat16) are copied as their bytes.
                if n:
                    view = host[offset:offset + n]
                    try:
                        self._host_views[name] = (view.view(torch.empty(0, dtype=dtype).numpy().dtype).reshape(shape),
                                                  False)
                    except TypeError:
                        self._host_views[name] = (view, True)
        elif layout != self._layout:
            raise ValueError("a round's tensors do not match the buffers' layout")
        self._wait_copied()
        for name, (view, as_bytes) in self._host_views.items():
            t = named[name]
            view[...] = (t.reshape(-1).view(torch.uint8) if as_bytes else t).numpy()
        self._copy_in()
        return self._device_plan(plan, tables, with_levels)

    def write_padded(self, plan: FlatPlan, capacity: TableCapacity, readouts: int, tables: dict) -> None:
        """:meth:`write` of ``pad_plan(plan, capacity, readouts)`` and ``tables``
        without levels, into buffers whose layout an earlier such write fixed,
        padding each field in the pinned buffer itself and building no device
        plan (a graph's replay reads the device plan it was captured over).
        The bytes copied are :meth:`write`'s. ``tables`` may hold numpy arrays
        (:func:`~flide_ext.kernels.tables.table_arrays`) or tensors.

        Raises:
            ValueError: as :func:`pad_plan`; no layout is fixed yet, or the round's
                fields or shapes differ from it.
        """
        padding = _padding(plan, capacity, readouts)
        if self._layout is None:
            raise ValueError("write_padded needs the buffers' layout fixed by an earlier write")
        # (array, padded size, fill): the padded fields as pad_plan pads them, the rest as they are (None).
        values = {name: (t, None, 0) for name, t in _named_tensors(plan, tables).items()}
        for name, (t, size, fill) in padding.items():
            if t is None:
                values.pop(name, None)
            else:
                values[name] = (t, size, fill)
        if values.keys() != self._host_views.keys():
            raise ValueError("a round's tensors do not match the buffers' layout")
        self._wait_copied()
        # numpy slices of 1-D views: a round writes a few dozen fields, and a torch
        # reshape or dispatch per field would cost several times the copy.
        for name, (view, as_bytes) in self._host_views.items():
            t, size, fill = values[name]
            a = t.numpy() if isinstance(t, torch.Tensor) else t
            n = a.size
            size = n if size is None else size
            if as_bytes or view.size != size or n > size or (a.ndim > 1 and a.shape != view.shape):
                raise ValueError(f"a round's {name} does not match the buffers' layout")
            flat = view.reshape(-1)
            flat[:n] = a.reshape(-1)
            flat[n:] = fill
        self._copy_in()

    def _wait_copied(self) -> None:
        # The pinned buffer is about to be overwritten: the last write's copy out
        # of it must have run (a round launched before this one may still be
        # waiting for the GPU, :mod:`~flide_ext.runtime.round_launch`).
        if self._copied is not None:
            self._copied.synchronize()
            self._copied = None

    def _copy_in(self) -> None:
        if self.device.type == "cpu":
            self._device.copy_(self._host)
        else:
            self._device.copy_(self._host, non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record()

    def _device_plan(self, plan: FlatPlan, tables: Optional[dict], with_levels: bool) -> FlatPlan:
        v = self._views
        changes = {f.name: v[f.name] for f in fields(FlatPlan) if f.name in v}
        if with_levels:
            changes["levels"] = [v[f"level{d}"] for d in range(len(plan.levels))]
        if tables is not None:
            kernel = {name: (v[name] if name in v else value) for name, value in tables.items() if name != "attention"}
            kernel["attention"] = {size: (att[0],) + tuple(v[f"attention{size}_{i}"] for i in range(len(att) - 1))
                                   for size, att in tables["attention"].items()}
            changes["tables"] = KernelTables(**kernel)
        return replace(plan, _level_tables=None, **changes)


def device_round(plan: FlatPlan, spec, device, capacity: Optional[TableCapacity] = None,
                 readouts: Optional[int] = None, buffers: Optional[RoundBuffers] = None,
                 device_plan: bool = True) -> Optional[FlatPlan]:
    """Pad (when ``capacity`` is given), build the kernel tables and copy a host
    plan to ``device`` through ``buffers`` (a fresh :class:`RoundBuffers` if None).

    Args:
        plan: the round's host plan (slots assigned).
        spec: the model's :class:`~flide_ext.runtime.graph_runner.TableSpec`
            (None: no kernel tables, e.g. for the CPU references).
        capacity, readouts: sizes to pad to (graph rounds), or None for the round's own.
        device_plan: False: the caller needs only the device buffers written (a
            graph's replay); padded into ``buffers`` whose layout is fixed
            already, nothing is returned (:meth:`RoundBuffers.write_padded`).

    Returns:
        The device plan (tensors are views of ``buffers``), with its
        :class:`~flide_ext.kernels.tables.KernelTables` when ``spec`` is given;
        None when ``device_plan`` is False and the fast path wrote it.

    Raises:
        ValueError: the round does not fit ``capacity``/``readouts``, resumes from
            checkpoints while padded, or does not match ``buffers``' layout.
    """
    buffers = buffers or RoundBuffers(device)
    readouts = readouts or int(plan.readout_rows.numel())
    tables = None
    if spec is not None:
        tables = table_arrays(plan, capacity, spec.conv_width, spec.block_sizes, spec.level_programs(capacity))
    if not device_plan and capacity is not None and tables is not None and buffers._layout is not None:
        buffers.write_padded(plan, capacity, readouts, tables)
        return None
    padded = pad_plan(plan, capacity, readouts) if capacity is not None else plan
    return buffers.write(padded, tables, with_levels=capacity is None)
