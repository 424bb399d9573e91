"""Flide as an SGLang plugin (entry-point group ``sglang.srt.plugins``).

With Flide installed, ``python -m sglang.launch_server --help`` lists
``--decision-mode``, and ``python -m sglang.launch_server --decision-mode
--model-path M [flags]`` starts Flide's decision server instead of SGLang's
engine, with SGLang's own flags mapped: model and tokenizer path, host, port,
dtype, device, API key, random seed, context length, served model name,
``--max-prefill-tokens`` (a round's token capacity), ``--max-running-requests``
(a round's request capacity), ``--disable-cuda-graph`` (Flide's graph mode
``off``), ``--disable-radix-cache`` (no state cache), ``--mem-fraction-static``
(the state cache's budget, :mod:`flide_ext.server.cache_args`),
``--enable-deterministic-inference`` (Flide's deterministic mode,
:mod:`flide_ext.runtime.determinism`), ``--skip-server-warmup`` (no warm-up
rounds, :mod:`flide_ext.runtime.warmup`), ``--decode-log-interval`` (rounds per
stats line), ``--sleep-on-idle`` (an idle scheduler blocks instead of polling),
``--disable-overlap-schedule`` (rounds one at a time, not the next launched while
the GPU computes the one before), ``--enable-cache-report`` (accepted: Flide
always reports cached tokens), ``--enable-fp32-lm-head`` (accepted: Flide's readout
logits are always float32, :mod:`flide_ext.layers.readout`), ``--watchdog-timeout`` (a round's time limit) and ``--max-queued-requests``
(requests sent to the scheduler and not yet answered). ``--state-cache-gb``,
``--max-body-mb``, ``--body-read-timeout``, ``--request-timeout``,
``--heartbeat-timeout`` and ``--round-seconds`` (Flide's own) are added to
SGLang's flags. Any other flag set away from its default is refused with a
message naming it as typed (Flide does not silently ignore a setting), and
Flide's own flags without ``--decision-mode`` are refused the same way; under
``--decision-mode`` a flag argparse cannot parse is one line, not SGLang's usage
(exit status 2 either way). A scheduler that
fails while serving ends the launcher with status 1.

``sglang serve --decision-mode ...`` (SGLang's recommended launcher, which loads
plugins before it parses) runs the same server; under ``--decision-mode`` its
diffusion-model check answers no without asking the model hub. Its ``--help``
returns before plugins load, so it does not list ``--decision-mode``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

MAPPED = {
    "model_path", "tokenizer_path", "host", "port", "dtype", "device", "api_key", "random_seed",
    "context_length", "served_model_name", "decision_mode", "max_prefill_tokens", "max_running_requests",
    "disable_cuda_graph", "disable_radix_cache", "mem_fraction_static", "state_cache_gb",
    "log_level", "log_level_http", "max_body_mb", "body_read_timeout",
    "watchdog_timeout", "max_queued_requests", "request_timeout", "heartbeat_timeout", "round_seconds",
    "enable_deterministic_inference", "residual_dtype", "skip_server_warmup", "decode_log_interval",
    "sleep_on_idle", "disable_overlap_schedule", "execution_strategy",
}
# Accepted without effect: every response's usage reports its cached tokens,
# with or without --enable-cache-report; the readout's logits are float32 with or
# without --enable-fp32-lm-head.
ACCEPTED = {"enable_cache_report", "enable_fp32_lm_head"}


def _add_flag(result, parser: argparse.ArgumentParser):
    parser.add_argument(
        "--decision-mode",
        action="store_true",
        help="Serve /v1/decisions and /v1/score with Flide's exact forked executor "
        "(one shared state, many single-token-label questions, one flat token stream).",
    )
    from .server_flags import add_server_flags

    add_server_flags(parser, prefix="Under --decision-mode: ")
    if decision_mode_given():
        # SGLang's behaviour without --decision-mode stays its own.
        from .parser_errors import one_line_errors

        one_line_errors(parser)
    return result


def decision_mode_given(argv: Optional[list] = None) -> bool:
    """Whether ``argv`` (default ``sys.argv[1:]``) gives ``--decision-mode``,
    or an abbreviation of it as argparse accepts one (``--decision``): checked
    before SGLang's parser runs."""
    argv = sys.argv[1:] if argv is None else argv
    return any(a.startswith("--deci") and "--decision-mode".startswith(a) for a in argv)


def _sglang_options() -> dict:
    # SGLang's flags: dest -> (default, option strings).
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return {a.dest: (a.default, a.option_strings) for a in parser._actions if a.dest != "help"}


def _as_typed(options: list, argv: list) -> str:
    # A flag as the command line gave it: one of its option strings, or a prefix
    # of one that argparse took for it (``--tp`` for ``--tp-size``; ``--tp=2``
    # too); else its first long option string.
    for arg in argv:
        name = arg.split("=", 1)[0]
        if name in options or (name.startswith("--") and len(name) > 2 and any(o.startswith(name) for o in options)):
            return name
    return next((o for o in options if o.startswith("--")), options[0])


def refused_flags(args: argparse.Namespace, argv: Optional[list] = None) -> list[str]:
    """SGLang flags set away from their defaults that Flide cannot honour, each
    named as ``argv`` (default ``sys.argv``) gave it."""
    options = _sglang_options()
    argv = sys.argv[1:] if argv is None else argv
    out = []
    for dest, value in vars(args).items():
        if dest.startswith("_") or dest in MAPPED or dest in ACCEPTED or dest not in options:
            continue
        default, strings = options[dest]
        if value != default:
            out.append(_as_typed(strings, argv) if strings else "--" + dest.replace("_", "-"))
    return sorted(out)


def serve_args(args: argparse.Namespace):
    """Map SGLang's parsed flags onto Flide's ServeArgs."""
    import torch

    from ..server.launch import ServeArgs

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype
    if dtype in (None, "auto"):
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    elif dtype == "half":
        dtype = "float16"
    return ServeArgs(
        model_path=args.model_path,
        tokenizer_path=args.tokenizer_path,
        host=args.host or "127.0.0.1",
        port=args.port,
        dtype=dtype,
        device=device,
        api_key=args.api_key,
        random_seed=args.random_seed,
        context_length=args.context_length,
        served_model_name=args.served_model_name,
        enable_deterministic_inference=bool(getattr(args, "enable_deterministic_inference", False)),
        skip_server_warmup=bool(getattr(args, "skip_server_warmup", False)),
        sleep_on_idle=bool(getattr(args, "sleep_on_idle", False)),
        disable_overlap_schedule=bool(getattr(args, "disable_overlap_schedule", False)),
        **_capacity(args),
        **_cache(args),
        **{name: getattr(args, name) for name in ("log_level", "log_level_http") if getattr(args, name, None)},
        **{name: getattr(args, name) for name in ("max_body_mb", "body_read_timeout", "decode_log_interval",
                                                  "execution_strategy")
           if getattr(args, name, None) is not None},
        **_liveness(args),
    )


def _capacity(args: argparse.Namespace) -> dict:
    # SGLang's prefill-batch limits are the round's capacities (its default
    # --max-prefill-tokens included, so a value given equal to it is honoured too).
    out = {}
    if getattr(args, "max_prefill_tokens", None) is not None:
        out["round_tokens"] = args.max_prefill_tokens
    if getattr(args, "max_running_requests", None) is not None:
        out["max_round_requests"] = args.max_running_requests
    if getattr(args, "disable_cuda_graph", False):
        out["cuda_graphs"] = "off"
    return out


def _liveness(args: argparse.Namespace) -> dict:
    # SGLang's --watchdog-timeout (its default included) and --max-queued-requests,
    # and Flide's own liveness flags when given (ServeArgs holds their defaults).
    out = {"watchdog_timeout": args.watchdog_timeout, "max_queued_requests": args.max_queued_requests}
    for name in ("request_timeout", "heartbeat_timeout", "round_seconds", "residual_dtype"):
        if getattr(args, name, None) is not None:
            out[name] = getattr(args, name)
    return out


def _cache(args: argparse.Namespace) -> dict:
    # Checked by serve (flide_ext.server.cache_args), like `flide serve`'s.
    return {"disable_radix_cache": bool(getattr(args, "disable_radix_cache", False)),
            "state_cache_gb": getattr(args, "state_cache_gb", None),
            "mem_fraction_static": getattr(args, "mem_fraction_static", None)}


def _around_from_cli_args(original, *call_args, **kwargs):
    args = call_args[-1] if call_args else kwargs["args"]
    if not getattr(args, "decision_mode", False):
        from .server_flags import flags_given

        own = flags_given(args)
        if own:  # SGLang's engine would ignore them: a forgotten --decision-mode
            print(f"{', '.join(own)} {'applies' if len(own) == 1 else 'apply'} to Flide's decision server only: "
                  f"add --decision-mode or remove {'it' if len(own) == 1 else 'them'}", file=sys.stderr)
            sys.exit(2)
        return original(*call_args, **kwargs)
    # Decision mode: Flide's server runs here and the process ends with it, so
    # SGLang's GPU engine is never configured.
    refused = refused_flags(args)
    if refused:
        print(f"--decision-mode: Flide cannot honour {', '.join(refused)}; remove "
              f"{'it' if len(refused) == 1 else 'them'}", file=sys.stderr)
        sys.exit(2)
    from ..protocol.errors import FlideError
    from ..server.launch import SchedulerFailed, serve

    try:
        serve(serve_args(args))
    except SchedulerFailed as e:
        print(f"--decision-mode: {e}", file=sys.stderr)
        sys.exit(1)
    except (FlideError, ValueError) as e:
        print(f"--decision-mode: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(0)


def _around_diffusion_check(original, *args, **kwargs) -> bool:
    # ``sglang serve`` asks every serve backend whether the model is its own
    # (after load_plugins); the diffusion backend fetches model_index.json from
    # the model hub for a name that is not a local directory (Flide's built-in
    # ``smollm2-135m``: ~40 s of retries offline). A decision server serves a
    # causal LM: under --decision-mode the answer is no, at once.
    if decision_mode_given():
        return False
    return original(*args, **kwargs)


def register() -> None:
    """Entry point called by SGLang's ``load_plugins()``."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register("sglang.srt.server_args.ServerArgs.add_cli_args", _add_flag, HookType.AFTER)
    HookRegistry.register("sglang.srt.server_args.ServerArgs.from_cli_args", _around_from_cli_args, HookType.AROUND)
    try:
        import sglang.cli.utils  # noqa: F401  (the hook's target must import: absent in older SGLang)
    except ImportError:
        return
    HookRegistry.register("sglang.cli.utils.get_is_diffusion_model", _around_diffusion_check, HookType.AROUND)
