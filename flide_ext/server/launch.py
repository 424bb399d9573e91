"""Start Flide's server: the scheduler process, then the tokenizer manager and
the HTTP server (uvicorn) in this process; and stop both, whatever happens.

* The scheduler fails (its process exits, sends no heartbeat for
  ``--heartbeat-timeout`` seconds, or runs a round past ``--watchdog-timeout``,
  :mod:`.liveness`): every waiting and every new request is answered 503 with
  why, ``/health`` answers 503, and after :data:`FAILED_LINGER_SECONDS` the
  server stops and :func:`serve` raises :class:`SchedulerFailed` (``flide
  serve`` and ``--decision-mode`` exit 1), so a supervisor restarts it.
* SIGTERM or SIGINT (either, or both, at any moment: while the model loads or
  mid-round): every waiting request is answered 503, the scheduler is stopped
  (SIGTERM and SIGCONT, then SIGKILL after :data:`STOP_GRACE_SECONDS`), then this process
  ends by that signal, as a process that does not handle it would (by the
  later of two: uvicorn passes on the signals it caught, last first).
* The scheduler never outlives this process, even one killed with SIGKILL
  (:func:`~.liveness.die_with_parent`).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Optional, Union

from ..protocol.errors import FlideError
from ..runtime.capacity import RoundCapacity
from ..runtime.precision import RESIDUAL_DTYPES
from .body_limits import BODY_READ_TIMEOUT_S, MAX_BODY_MB, body_limits
from .prefix_strategy import SERVED_STRATEGIES

_ROUND = RoundCapacity()  # the round-capacity defaults
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
HTTP_LOG_LEVELS = ("trace",) + LOG_LEVELS  # uvicorn's
FAILED_LINGER_SECONDS = 1.0  # a failed server answers 503 this long (probes see it), then exits
STOP_GRACE_SECONDS = 3.0  # the scheduler's time to end on SIGTERM before SIGKILL


class SchedulerFailed(FlideError):
    """The scheduler process failed while serving (why, in words); every request
    was answered 503 and the server has stopped."""


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
    watchdog_timeout: float = 300.0  # SGLang's default: seconds a round may run before the server exits
    max_queued_requests: Optional[int] = None  # SGLang's: requests sent and not yet answered (None: no limit)
    request_timeout: Optional[float] = None  # seconds a request may take (504 after); None: no limit
    heartbeat_timeout: float = 30.0  # seconds without a scheduler heartbeat before it counts as stopped
    round_seconds: float = 1.0  # a round's time budget: its tokens capped by past rounds' seconds per token
    enable_deterministic_inference: bool = False  # SGLang's: row-invariant GEMMs (runtime/determinism.py)
    residual_dtype: Optional[str] = None  # "float32" or "model"; None: the engine's default (float32)
    skip_server_warmup: bool = False  # SGLang's: no warm-up rounds at start (they run on CUDA devices only)
    decode_log_interval: int = 40  # SGLang's (its default): rounds per stats line
    sleep_on_idle: bool = False  # SGLang's: an idle scheduler blocks on its socket (else it polls, on CUDA devices)
    disable_overlap_schedule: bool = False  # SGLang's: rounds one at a time (else, on CUDA, the next is launched meanwhile)
    execution_strategy: str = SERVED_STRATEGIES[0]  # prefix_cache: each question its own request (prefix_strategy.py)


def serve(args: ServeArgs) -> None:
    """Run the server until it is stopped (SIGTERM, SIGINT) or its scheduler fails.

    A SIGTERM or SIGINT ends this process by that signal once both processes
    have stopped (see the module's docstring).

    Raises:
        FlideError: the model or tokenizer cannot be loaded, or the scheduler
            process exited while loading it; a round capacity below
            1; an unknown log level; an unknown decision strategy, or ``prefix_cache`` without the state cache; an unknown CUDA-graph mode, graphs on a CPU device, or a malformed
            graph capacity list; a bad state-cache flag (:func:`~.cache_args.cache_settings`); a body
            limit that is not a positive number (:func:`~.body_limits.body_limits`); a liveness or
            queue flag that is not a positive finite number (:func:`_limits`); an unknown
            residual dtype; a port outside [0, 65535]; an address that cannot be
            bound (a port in use: checked before the model loads).
        SchedulerFailed: the scheduler failed while serving.
    """
    from .cache_args import cache_settings

    launched = time.perf_counter()
    # The flags first, before the server's imports: a bad one is one quick line.
    if args.residual_dtype not in (None, *RESIDUAL_DTYPES):
        raise FlideError(f"--residual-dtype must be one of {', '.join(RESIDUAL_DTYPES)}, not {args.residual_dtype!r}")
    if args.execution_strategy not in SERVED_STRATEGIES:
        raise FlideError(f"--execution-strategy must be one of {', '.join(SERVED_STRATEGIES)}, "
                         f"not {args.execution_strategy!r}")
    if args.execution_strategy == "prefix_cache" and args.disable_radix_cache:
        raise FlideError("--execution-strategy prefix_cache resumes questions from the state cache: "
                         "remove --disable-radix-cache")
    try:
        capacity = RoundCapacity(args.round_tokens, args.round_segments, args.max_round_requests)
    except ValueError as e:
        raise FlideError(f"{e} (--round-tokens, --round-segments, --max-round-requests; --max-prefill-tokens, "
                         "--max-running-requests under --decision-mode)") from None
    graphs = _graph_settings(args)
    log_level, http_log_level = _log_levels(args)
    cache, fraction = cache_settings(args.disable_radix_cache, args.state_cache_gb, args.mem_fraction_static,
                                     args.device)
    limits = _limits(args)
    if not isinstance(args.port, int) or not 0 <= args.port <= 65535:  # uvicorn would wrap it, and log the flag's
        raise FlideError(f"--port must be an integer in [0, 65535], not {args.port!r}")
    limits["max_body_bytes"], limits["body_read_timeout"] = body_limits(args.max_body_mb, args.body_read_timeout)
    from .listen_socket import bind

    listener = bind(args.host, args.port)  # before the imports and the model's load

    import shutil

    import zmq

    from ..assets.builtin_models import resolve_model_path
    from .liveness import heartbeat_interval
    from .scheduler import run_scheduler

    try:
        if args.random_seed is not None:
            import torch

            torch.manual_seed(args.random_seed)
        path = str(resolve_model_path(args.model_path))
    except BaseException:
        listener.close()
        raise
    ipc = tempfile.mkdtemp(prefix="flide-")
    addrs = {name: f"ipc://{ipc}/{name}" for name in ("work", "done", "heartbeat", "abort")}
    # The readiness message is read synchronously; the asyncio socket that reads
    # results is bound on the same address afterwards (ZMQ reconnects the pusher).
    sync = zmq.Context()
    waiting = sync.socket(zmq.PULL)
    waiting.bind(addrs["done"])
    heartbeats = sync.socket(zmq.PULL)
    heartbeats.bind(addrs["heartbeat"])
    engine_kwargs = dict(model_path=path, dtype=args.dtype, device=args.device, context_length=args.context_length,
                         tokenizer_path=args.tokenizer_path, deterministic=args.enable_deterministic_inference,
                         residual_dtype=args.residual_dtype, **graphs, **cache)
    scheduler = multiprocessing.get_context("spawn").Process(
        target=run_scheduler, args=(engine_kwargs, addrs["work"], addrs["done"], capacity, fraction, log_level),
        kwargs=dict(heartbeat_addr=addrs["heartbeat"], abort_addr=addrs["abort"],
                    round_seconds=limits["round_seconds"], log_interval=limits["decode_log_interval"],
                    warmup=False if args.skip_server_warmup else None,
                    sleep_on_idle=True if args.sleep_on_idle else None,
                    overlap=False if args.disable_overlap_schedule else None,
                    heartbeat_interval=heartbeat_interval(limits["heartbeat_timeout"])),
        daemon=True,
    )
    signals = _StopSignals()
    try:
        scheduler.start()
        # The HTTP side's imports while the scheduler loads the model.
        server = _http_server(args, path, capacity, limits, http_log_level, addrs, scheduler, heartbeats,
                              wait_ready=lambda: _wait_ready(waiting, scheduler), launched=launched)
        server.run(sockets=[listener])
        if server.monitor.failure is not None:
            raise SchedulerFailed(f"{server.monitor.failure}; the server stopped")
        if not server.started:  # uvicorn could not listen (it logged why)
            raise FlideError(f"the HTTP server could not start on {args.host}:{args.port}")
    except _Stopped as stop:
        signals.received = stop.signum
    finally:
        signals.defer()  # a second signal now must not cut the cleanup short
        _stop(scheduler)
        sync.destroy(linger=0)
        listener.close()
        shutil.rmtree(ipc, ignore_errors=True)
        signals.restore()


def _http_server(args: ServeArgs, path: str, capacity: RoundCapacity, limits: dict, http_log_level: str,
                 addrs: dict, scheduler, heartbeats, wait_ready, launched: float):
    # The tokenizer manager, the app and uvicorn's server over them, once
    # wait_ready() has the scheduler's SchedulerReady (imported before: meanwhile).
    import asyncio
    import gc

    import uvicorn
    import zmq.asyncio
    from transformers import AutoTokenizer

    from .http_server import ServerInfo, build_app
    from .liveness import SchedulerMonitor
    from .metrics import Metrics
    from .request_ids import uvicorn_log_config
    from .round_log import configure_logging, logger, ready_line
    from .tokenizer_manager import TokenizerManager

    ready = wait_ready()
    done = zmq.asyncio.Context.instance().socket(zmq.PULL)
    done.bind(addrs["done"])
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_path or path)
    metrics = Metrics()
    stats = ready.info.get("cache", {"enabled": False})
    metrics.cache(stats)
    served = args.served_model_name or args.model_path
    manager = TokenizerManager(tokenizer, ready.context_length, ready.vocab_size, addrs["work"], done, metrics, served,
                               capacity, resumes=bool(stats.get("enabled")),
                               max_queued_requests=limits["max_queued_requests"],
                               request_timeout=limits["request_timeout"], abort_addr=addrs["abort"],
                               strategy=args.execution_strategy)
    info = ServerInfo(path, args.served_model_name or args.model_path, ready.context_length, ready.vocab_size,
                      args.dtype, args.device, args.api_key, args.disable_radix_cache, stats.get("budget_bytes", 0),
                      stats.get("max_tokens", 0), limits["max_body_bytes"], limits["body_read_timeout"],
                      args.enable_deterministic_inference, ready.info.get("residual_dtype", ""))
    app = build_app(manager, info, metrics)

    class Server(uvicorn.Server):
        """uvicorn's server, which watches the scheduler while it serves and,
        stopping, answers every request still waiting (503), then stops the
        scheduler (before uvicorn passes on a signal it caught)."""

        def __init__(self, config):
            super().__init__(config)
            self.monitor = SchedulerMonitor(scheduler, heartbeats, limits["heartbeat_timeout"],
                                            limits["watchdog_timeout"], self._scheduler_failed)

        async def startup(self, sockets=None):
            await super().startup(sockets)
            manager.start()
            self.monitor.start()
            if self.started:
                configure_logging(args.log_level)
                host = f"[{args.host}]" if ":" in args.host else args.host
                port = self.servers[0].sockets[0].getsockname()[1] if self.servers else args.port  # --port 0's too
                logger.info(ready_line(f"http://{host}:{port}", served, args.dtype, ready.info,
                                       time.perf_counter() - launched, args.execution_strategy))
            gc.collect()  # as the scheduler does once loaded (SGLang freezes its processes after warmup)
            gc.freeze()

        def _scheduler_failed(self, reason: str) -> None:
            manager.fail(f"{reason}; the server is stopping")
            asyncio.get_running_loop().call_later(FAILED_LINGER_SECONDS, setattr, self, "should_exit", True)

        async def shutdown(self, sockets=None):
            self.monitor.stop()
            manager.fail("the server is shutting down")
            await super().shutdown(sockets)
            _stop(scheduler)

    return Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=http_log_level,
                                 log_config=uvicorn_log_config()))


def _wait_ready(socket, scheduler):
    # The scheduler's SchedulerReady, or FlideError: its load failed or its process exited.
    while not socket.poll(500):
        if scheduler.exitcode is not None:
            raise FlideError(f"the scheduler process exited with code {scheduler.exitcode} while loading the model")
    ready = socket.recv_pyobj()
    socket.close(linger=0)
    if isinstance(ready, Exception):
        raise FlideError(str(ready))
    return ready


def _stop(scheduler) -> None:
    # SIGTERM ends it at once even mid-round (it installs no handler); SIGCONT
    # lets a stopped one (SIGSTOP) take it; SIGKILL if it has not ended even so.
    if scheduler.pid is None:
        return
    if scheduler.is_alive():
        scheduler.terminate()
        try:
            os.kill(scheduler.pid, signal.SIGCONT)
        except (OSError, AttributeError):  # gone already, or no SIGCONT on this system
            pass
        scheduler.join(STOP_GRACE_SECONDS)
    if scheduler.is_alive():
        scheduler.kill()
    scheduler.join()


class _Stopped(BaseException):
    """SIGTERM or SIGINT outside uvicorn's own handling of them: while the model
    loads, or as uvicorn passes on the one it caught."""

    def __init__(self, signum: int):
        self.signum = signum


class _StopSignals:
    """serve()'s handling of SIGTERM and SIGINT (in the main thread only, where
    Python delivers signals): raised as :class:`_Stopped` while serving, then
    deferred during the cleanup, then this process ends by the one that stopped it."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.received: Optional[int] = None
        self.active = threading.current_thread() is threading.main_thread()
        self.previous = {}
        if self.active:
            self.previous = {sig: signal.signal(sig, self._raise) for sig in self.SIGNALS}

    @staticmethod
    def _raise(signum, frame):
        raise _Stopped(signum)

    def _note(self, signum, frame):
        if self.received is None:
            self.received = signum

    def defer(self) -> None:
        if self.active:
            for sig in self.SIGNALS:
                signal.signal(sig, self._note)

    def restore(self) -> None:
        if not self.active:
            return
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        if self.received is not None:
            signal.signal(self.received, signal.SIG_DFL)
            signal.raise_signal(self.received)


def _limits(args: ServeArgs) -> dict:
    # The liveness and queue flags, checked before any process starts.
    out = {}
    for name, flag, kind, optional in (("watchdog_timeout", "--watchdog-timeout", float, False),
                                       ("heartbeat_timeout", "--heartbeat-timeout", float, False),
                                       ("request_timeout", "--request-timeout", float, True),
                                       ("max_queued_requests", "--max-queued-requests", int, True),
                                       ("round_seconds", "--round-seconds", float, False),
                                       ("decode_log_interval", "--decode-log-interval", int, False)):
        value = getattr(args, name)
        if value is None and optional:
            out[name] = None
            continue
        try:
            number = kind(value)
        except (TypeError, ValueError):
            number = None
        if number is None or not 0 < number < math.inf or (kind is int and number != value):
            raise FlideError(f"{flag} must be a positive {'integer' if kind is int else 'finite number of seconds'}, "
                             f"not {value!r}")
        out[name] = number
    return out


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
