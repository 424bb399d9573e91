"""Start Flide's server: the scheduler process, then the tokenizer manager and
the HTTP server (uvicorn) in this process."""

from __future__ import annotations

import multiprocessing
import tempfile
from dataclasses import dataclass
from typing import Optional, Union

from ..protocol.errors import FlideError
from ..runtime.capacity import RoundCapacity
from .body_limits import BODY_READ_TIMEOUT_S, MAX_BODY_MB, body_limits

_ROUND = RoundCapacity()  # the round-capacity defaults
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
HTTP_LOG_LEVELS = ("trace",) + LOG_LEVELS  # uvicorn's


@dataclass
class ServeArgs:
    """What ``flide serve`` and ``--decision-mode`` accept (SGLang's names)."""

    model_path: str
    tokenizer_path: Optional[str] = None
    host: str = "127.0.0.1"
    port: int = 30000
    dtype: str = "float32"
    device: str = "cpu"
    api_key: Optional[str] = None
    random_seed: Optional[int] = None
    context_length: Optional[int] = None
    served_model_name: Optional[str] = None
    max_round_requests: int = _ROUND.requests
    round_tokens: int = _ROUND.tokens
    round_segments: int = _ROUND.segments
    cuda_graphs: Optional[str] = None
    graph_capacities: Optional[str] = None
    disable_radix_cache: bool = False
    state_cache_gb: Union[float, str, None] = None  # a number, or its text as given (checked by serve)
    mem_fraction_static: Union[float, str, None] = None
    log_level: str = "info"  # SGLang's: the scheduler logs each round at info
    log_level_http: Optional[str] = None  # uvicorn's (access log at info); None: log_level
    max_body_mb: Union[float, str] = MAX_BODY_MB  # MiB; a number, or its text as given (checked by serve)
    body_read_timeout: Union[float, str] = BODY_READ_TIMEOUT_S  # seconds, likewise


def serve(args: ServeArgs) -> None:
    """Run the server until interrupted.

    Raises:
        FlideError: the model or tokenizer cannot be loaded; a round capacity below
            1; an unknown log level; an unknown CUDA-graph mode, graphs on a CPU device, or a malformed
            graph capacity list; a bad state-cache flag (:func:`~.cache_args.cache_settings`); a body
            limit that is not a positive number (:func:`~.body_limits.body_limits`).
    """
    from .cache_args import cache_settings

    # The flags first, before the server's imports: a bad one is one quick line.
    try:
        capacity = RoundCapacity(args.round_tokens, args.round_segments, args.max_round_requests)
    except ValueError as e:
        raise FlideError(f"{e} (--round-tokens, --round-segments, --max-round-requests; --max-prefill-tokens, "
                         "--max-running-requests under --decision-mode)") from None
    graphs = _graph_settings(args)
    log_level, http_log_level = _log_levels(args)
    cache, fraction = cache_settings(args.disable_radix_cache, args.state_cache_gb, args.mem_fraction_static,
                                     args.device)
    max_body_bytes, body_read_timeout = body_limits(args.max_body_mb, args.body_read_timeout)

    import shutil

    import uvicorn
    import zmq
    import zmq.asyncio
    from transformers import AutoTokenizer

    from ..assets.builtin_models import resolve_model_path
    from .http_server import ServerInfo, build_app
    from .metrics import Metrics
    from .request_ids import uvicorn_log_config
    from .scheduler import run_scheduler
    from .tokenizer_manager import TokenizerManager

    if args.random_seed is not None:
        import torch

        torch.manual_seed(args.random_seed)
    path = str(resolve_model_path(args.model_path))
    ipc = tempfile.mkdtemp(prefix="flide-")
    work_addr, done_addr = f"ipc://{ipc}/work", f"ipc://{ipc}/done"
    # The readiness message is read synchronously; the asyncio socket that reads
    # results is bound on the same address afterwards (ZMQ reconnects the pusher).
    sync = zmq.Context()
    waiting = sync.socket(zmq.PULL)
    waiting.bind(done_addr)
    engine_kwargs = dict(model_path=path, dtype=args.dtype, device=args.device, context_length=args.context_length,
                         tokenizer_path=args.tokenizer_path, **graphs, **cache)
    scheduler = multiprocessing.get_context("spawn").Process(
        target=run_scheduler, args=(engine_kwargs, work_addr, done_addr, capacity, fraction, log_level),
        daemon=True
    )
    scheduler.start()
    ready = waiting.recv_pyobj()
    waiting.close(linger=0)
    sync.term()
    if isinstance(ready, Exception):
        scheduler.join(5)
        shutil.rmtree(ipc, ignore_errors=True)
        raise FlideError(str(ready))
    done = zmq.asyncio.Context.instance().socket(zmq.PULL)
    done.bind(done_addr)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_path or path)
    metrics = Metrics()
    stats = ready.info.get("cache", {"enabled": False})
    metrics.cache(stats)
    served = args.served_model_name or args.model_path
    manager = TokenizerManager(tokenizer, ready.context_length, ready.vocab_size, work_addr, done, metrics, served,
                               capacity, resumes=bool(stats.get("enabled")))
    info = ServerInfo(path, args.served_model_name or args.model_path, ready.context_length, ready.vocab_size,
                      args.dtype, args.device, args.api_key, args.disable_radix_cache, stats.get("budget_bytes", 0),
                      stats.get("max_tokens", 0), max_body_bytes, body_read_timeout)
    app = build_app(manager, info, metrics)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=http_log_level, log_config=uvicorn_log_config())
    finally:
        scheduler.terminate()
        shutil.rmtree(ipc, ignore_errors=True)


def _log_levels(args: ServeArgs) -> tuple[str, str]:
    # (scheduler's, uvicorn's) levels, lower case; checked before any process starts.
    level = str(args.log_level).lower()
    if level not in LOG_LEVELS:
        raise FlideError(f"--log-level {args.log_level!r} is not one of {', '.join(LOG_LEVELS)}")
    http = str(args.log_level_http).lower() if args.log_level_http else level
    if http not in HTTP_LOG_LEVELS:
        raise FlideError(f"--log-level-http {args.log_level_http!r} is not one of {', '.join(HTTP_LOG_LEVELS)}")
    return level, http


def _graph_settings(args: ServeArgs) -> dict:
    # Checked here, before any process starts, so a bad flag is one line.
    from ..runtime.graph_capacities import parse_capacities
    from ..runtime.graph_runner import MODES

    out: dict = {}
    on_gpu = str(args.device).startswith("cuda")
    if args.cuda_graphs is not None:
        if args.cuda_graphs not in MODES:
            raise FlideError(f"--cuda-graphs {args.cuda_graphs!r} is not one of {', '.join(MODES)}")
        if args.cuda_graphs != "off" and not on_gpu:
            raise FlideError(f"--cuda-graphs {args.cuda_graphs} needs a CUDA device (--device {args.device})")
        out["cuda_graphs"] = args.cuda_graphs
    if args.graph_capacities is not None:
        if not on_gpu or out.get("cuda_graphs", "flat") != "flat":
            raise FlideError("--graph-capacities only applies with flat CUDA graphs on a CUDA device "
                             f"(--device {args.device}, --cuda-graphs {out.get('cuda_graphs', 'flat')})")
        try:
            out["graph_capacities"] = parse_capacities(args.graph_capacities)
        except ValueError as e:
            raise FlideError(f"--graph-capacities: {e}") from None
    return out
