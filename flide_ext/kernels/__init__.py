"""Flide's compute kernels, one package per op, imported one way.

Each op's package is its public function (signature, argument checks, dispatch
on the caller's ``backend``: :mod:`.dispatch`) over two leaves that never import
each other: ``reference.py``, the plain PyTorch reference of the same signature
(what CPU runs and what tests compare against), and the Triton kernel
(``kernel.py``; the gated delta rule's GPU path is split by step). Shared leaves:
:mod:`.arguments` (checks both paths need), :mod:`.dispatch`, :mod:`.round_cache`
(per-round memo of host metadata), :mod:`.tables` (a round's tables for every
kernel, built on the host) and :mod:`.fla_configs` (fla-core's tuned launch
configurations). Nothing here imports the planner: kernels read tensors and
tables.
"""
