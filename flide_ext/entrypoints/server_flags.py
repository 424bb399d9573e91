"""Flide's own server flags, the ones SGLang's launcher does not have: declared
once, added both to ``flide serve`` and (under ``--decision-mode``) to
``python -m sglang.launch_server``. SGLang's flags that Flide maps are declared
by SGLang (``--decision-mode``) or by ``flide serve`` alone."""

from __future__ import annotations

import argparse


def _flags():
    # (flag, metavar, type, help): type None leaves the text to the server's own
    # check (one line naming the flag, not argparse's usage block).
    from ..server.launch import ServeArgs

    served = ServeArgs("")  # the server's defaults, as the help states them
    return (
        ("--state-cache-gb", "GB", None,
         "the state cache's memory in GiB (2**30 bytes); wins over --mem-fraction-static (default: 40%% of the GPU "
         "memory free after the weights and one round's working pools, 256 MiB on the CPU)"),
        ("--max-body-mb", "MB", None,
         f"largest request body in MiB (2**20 bytes); a larger one is refused with 413 "
         f"(default: {served.max_body_mb:g})"),
        ("--body-read-timeout", "SECONDS", None,
         f"seconds a request body may take to arrive; a slower one is refused with 408 "
         f"(default: {served.body_read_timeout:g})"),
        ("--request-timeout", "S", float, "answer a request 504 after S seconds and withdraw it (default: no limit)"),
        ("--heartbeat-timeout", "S", float,
         "a scheduler silent for S seconds (stopped or hung) takes the server down, every request answered 503 "
         f"(default: {served.heartbeat_timeout:g})"),
        ("--residual-dtype", "DTYPE", None,
         "the residual stream's dtype in a bf16 / fp16 model: float32 (the default: no block's sum rounded) or "
         "model (the model's dtype, as a plain half-precision forward)"),
        ("--execution-strategy", "NAME", None,
         "how a request's questions run: flide (the default: forked from the state in one round) or prefix_cache "
         "(as today's serving engines, for comparison: the state computed once into the state cache, then each "
         "question as its own request resuming from it)"),
        ("--round-seconds", "S", float,
         "hold each round to about S seconds, from past rounds' seconds per stream token; the first waiting "
         f"request always goes (default: {served.round_seconds:g})"),
    )


def add_server_flags(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """Add Flide's own server flags to ``parser``, each help text after ``prefix``."""
    for flag, metavar, kind, text in _flags():
        parser.add_argument(flag, metavar=metavar, type=kind, help=prefix + text)


def flags_given(args: argparse.Namespace) -> list[str]:
    """Flide's own server flags that ``args`` sets (each unset one is None), as
    their option strings, in declaration order."""
    return [flag for flag, *_ in _flags() if getattr(args, flag[2:].replace("-", "_"), None) is not None]
