"""Helpers shared by the test modules: tiny checkpoints (``checkpoints``), exactness
assertions (``exact_checks``), decision requests (``decisions``), subprocesses of the
CLI and the server (``processes``), kernel inputs (``kernel_inputs``) and plans
(``plans``)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository root."""
EXAMPLES = ROOT / "examples"
