"""``flide`` command line.

``flide decide --model PATH|smollm2-135m --input requests.jsonl [--output answers.jsonl]``
answers a JSON-lines file of SGLang ``/v1/decisions`` requests, a round of
``--round-size`` requests at a time, and prints the accuracy on questions that
carry an expected answer and the tokens saved by forking.

Input lines are either a bare DecisionRequest or ``{"id": ..., "request":
DecisionRequest, "expected": {question_id: answer}}``, where an answer is an
option name (choice), ``"yes"``/``"no"`` (yes_no) or a level index (score).
Each output line is ``{"id": ..., "response": DecisionResponse}`` or
``{"id": ..., "error": {"field": ..., "message": ...}}``.

``flide make-checkpoint --shape qwen3.5-4b --output DIR`` writes a random-weight
checkpoint of a real Qwen3.5 or Gemma 4 shape with the Qwen3.5 tokenizer, for benchmarks.

Exit status: 0 when every request was answered, 1 when some were refused (their
error lines say why), 2 when the command itself cannot run (one line on stderr).
``flide serve`` exits 1 when its scheduler failed while serving (it exited,
stopped sending heartbeats, or ran a round past ``--watchdog-timeout``; one line
on stderr says which, after every request was answered 503), 2 when it cannot
start; stopped by SIGTERM or SIGINT, it ends by that signal.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

from ..protocol.errors import FlideError, RequestError
from .parser_errors import OneLineParser


class CLIError(Exception):
    """A command that cannot run: printed as one line, exit status 2."""


@dataclass
class Entry:
    id: str
    request: Any
    expected: dict = field(default_factory=dict)
    error: Optional[RequestError] = None


def read_entries(path: str) -> list[Entry]:
    try:
        # utf-8-sig: a byte-order mark is not part of the first line.
        text = open(path, encoding="utf-8-sig").read()
    except OSError as e:
        raise CLIError(f"--input {path!r}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise CLIError(f"--input {path!r} is not UTF-8 text (byte {e.start})") from None
    entries = []
    # JSON lines end at "\n" only: U+2028 and friends are legal inside JSON strings.
    for n, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        ident = f"line-{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            entries.append(Entry(ident, None, error=RequestError(f"line {n}", f"is not valid JSON: {e.msg}")))
            continue
        except RecursionError:
            entries.append(Entry(ident, None, error=RequestError(f"line {n}", "is nested too deeply")))
            continue
        if isinstance(obj, dict) and "request" in obj:
            ident = str(obj.get("id", ident))
            expected = obj.get("expected") or {}
            if not isinstance(expected, dict):
                error = RequestError("expected", "must be an object mapping question ids to answers")
                entries.append(Entry(ident, None, error=error))
                continue
            entries.append(Entry(ident, obj["request"], expected))
        else:
            entries.append(Entry(ident, obj))
    return entries


def write_line(out, line: dict) -> None:
    try:
        out.write(json.dumps(line, ensure_ascii=False) + "\n")
    except UnicodeEncodeError:  # a lone surrogate in an id: escape it instead
        out.write(json.dumps(line, ensure_ascii=True) + "\n")


def predicted(answer: dict) -> str:
    probabilities = answer["probabilities"]
    return max(probabilities, key=probabilities.get)


def run_decide(args) -> int:
    from ..assets.builtin_models import check_model_path

    if args.context_length is not None and args.context_length < 1:
        raise CLIError("--context-length must be at least 1")
    entries = read_entries(args.input)
    try:
        check_model_path(args.model)  # before the imports below: a wrong path is one line at once
    except FlideError as e:
        raise CLIError(str(e)) from None
    from tqdm import tqdm

    from ..runtime.engine import Engine

    try:
        engine = Engine(args.model, dtype=args.dtype, device=args.device, context_length=args.context_length)
    except (FlideError, ValueError) as e:
        raise CLIError(str(e)) from None
    # Opened only once the model loaded, so a failed start leaves an old file intact.
    try:
        out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    except OSError as e:
        raise CLIError(f"--output {args.output!r}: {e.strerror}") from None

    correct = total = failed = 0
    prompt_tokens = stream_tokens = 0
    todo = [e for e in entries if e.error is None]
    results: dict[int, Any] = {}
    # Every input line is counted: those refused while reading at once.
    with tqdm(total=len(entries), desc="decide", unit="req", file=sys.stderr) as bar:
        bar.update(len(entries) - len(todo))
        for start in range(0, len(todo), args.round_size):
            chunk = todo[start : start + args.round_size]
            answered = engine.decide_batch([e.request for e in chunk])
            for entry, result in zip(chunk, answered):
                results[id(entry)] = result
            prompt_tokens += answered.stats.prompt_tokens
            stream_tokens += answered.stats.stream_tokens
            bar.update(len(chunk))

    for entry in entries:
        result = entry.error or results[id(entry)]
        if isinstance(result, RequestError):
            failed += 1
            line = {"id": entry.id, "error": result.to_dict()}
        else:
            response = result.model_dump(exclude_none=True)
            line = {"id": entry.id, "response": response}
            for qid, want in entry.expected.items():
                if qid in response["answers"]:
                    total += 1
                    correct += predicted(response["answers"][qid]) == str(want)
        write_line(out, line)
    if out is not sys.stdout:
        out.close()

    answered = len(entries) - failed
    print(f"requests: {answered} answered, {failed} refused", file=sys.stderr)
    if total:
        print(f"accuracy: {correct}/{total} = {correct / total:.1%} of questions with an expected answer", file=sys.stderr)
    if prompt_tokens:
        saved = prompt_tokens - stream_tokens
        print(
            f"tokens: {stream_tokens} in flat streams vs {prompt_tokens} in per-question prompts "
            f"({saved} saved by forking, {saved / prompt_tokens:.1%})",
            file=sys.stderr,
        )
    return 1 if failed else 0


def run_make_checkpoint(args) -> int:
    import torch
    from tqdm import tqdm

    from ..assets.random_checkpoints import (count_parameters, shape_config, shape_names, with_head_scale,
                                             write_random_checkpoint)

    if args.shape not in shape_names():
        raise CLIError(f"--shape {args.shape!r} is not one of {', '.join(shape_names())}")
    try:
        config = with_head_scale(shape_config(args.shape), args.head_scale)
    except ValueError as e:
        raise CLIError(f"--head-scale: {e}") from None
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}[args.dtype]
    with tqdm(desc=f"write {args.shape}", unit="tensor", file=sys.stderr) as bar:
        write_random_checkpoint(args.output, config, dtype=dtype, seed=args.seed, head_scale=args.head_scale, progress=bar)
    print(f"wrote {args.shape} ({count_parameters(config) / 1e9:.2f}B parameters, {args.dtype}) to {args.output}", file=sys.stderr)
    return 0


def run_serve(args) -> int:
    from ..server.launch import SchedulerFailed, ServeArgs, serve

    fields = {k: v for k, v in vars(args).items() if k in ServeArgs.__dataclass_fields__ and v is not None}
    try:
        serve(ServeArgs(**fields))
    except SchedulerFailed as e:
        print(f"flide: error: {e}", file=sys.stderr)
        return 1
    except (FlideError, ValueError) as e:
        raise CLIError(str(e)) from None
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="flide", description="Exact forked decision inference.")
    sub = parser.add_subparsers(dest="command", required=True)
    decide = sub.add_parser("decide", help="answer a JSON-lines file of /v1/decisions requests")
    decide.add_argument("--model", required=True, help="checkpoint directory or built-in name (smollm2-135m)")
    decide.add_argument("--input", required=True, help="JSON-lines file of decision requests")
    decide.add_argument("--output", help="where to write answer lines (default: stdout)")
    decide.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="compute dtype (default: float32)")
    decide.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    decide.add_argument("--round-size", type=int, default=8, help="requests per round (default: 8)")
    decide.add_argument("--context-length", type=int, default=None, help="longest prompt accepted, in tokens")
    decide.set_defaults(func=run_decide)
    make = sub.add_parser("make-checkpoint", help="write a random-weight checkpoint of a real Qwen3.5 or Gemma 4 shape")
    make.add_argument("--shape", required=True, help="qwen3.5-0.8b, qwen3.5-2b, qwen3.5-4b, qwen3.5-9b, gemma4-e4b or "
                      "gemma4-31b (Gemma 4 with the Qwen3.5 tokenizer as a stand-in)")
    make.add_argument("--output", required=True, help="checkpoint directory to write")
    make.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"],
                      help="stored weight dtype (default: bfloat16)")
    make.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    make.add_argument("--head-scale", type=float, default=1.0, help="LM head init scale (peaked distributions; not 1 unties a tied head)")
    make.set_defaults(func=run_make_checkpoint)
    from ..server.launch import ServeArgs
    from .server_flags import add_server_flags

    served = ServeArgs("")  # the server's defaults, as the help states them
    serve = sub.add_parser("serve", help="serve SGLang's decision routes over HTTP")
    serve.add_argument("--model-path", required=True, help="checkpoint directory or built-in name")
    serve.add_argument("--tokenizer-path")
    serve.add_argument("--host", help=f"address to listen on (default: {served.host})")
    serve.add_argument("--port", type=int, help=f"port to listen on (default: {served.port})")
    serve.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                       help=f"compute dtype (default: {served.dtype})")
    serve.add_argument("--device", help=f"torch device (default: {served.device})")
    serve.add_argument("--api-key")
    serve.add_argument("--random-seed", type=int)
    serve.add_argument("--context-length", type=int)
    serve.add_argument("--served-model-name")
    serve.add_argument("--round-tokens", type=int,
                       help=f"most flat-stream tokens per round (default: {served.round_tokens})")
    serve.add_argument("--round-segments", type=int,
                       help=f"most prefix-tree segments per round (default: {served.round_segments})")
    serve.add_argument("--max-round-requests", type=int,
                       help=f"most requests per round (default: {served.max_round_requests})")
    serve.add_argument("--cuda-graphs", choices=["flat", "per_shape", "off"],
                       help="CUDA graphs: flat (a few stream capacities, the default on CUDA), per_shape or off")
    serve.add_argument("--graph-capacities",
                       help="flat graphs' capacities as tokens:segments[:levels],... (default: a ladder up to the round capacity)")
    serve.add_argument("--disable-radix-cache", action="store_true",
                       help="keep no state cache: every request computes its whole state (SGLang's flag)")
    serve.add_argument("--mem-fraction-static", metavar="F",
                       help="size the state cache as F of the GPU's memory, less the weights and an 8 GiB reserve "
                       "(SGLang's flag; --state-cache-gb wins)")
    # Checked by serve (one line, exit 2), not by argparse's choices (its usage block).
    serve.add_argument("--log-level", help=f"the server's log level: debug (every round logged), info (the rounds' "
                       f"stats every --decode-log-interval rounds), warning, error or critical "
                       f"(default: {served.log_level})")
    serve.add_argument("--decode-log-interval", type=int, metavar="N",
                       help=f"log the rounds' stats every N rounds (SGLang's flag; default: {served.decode_log_interval})")
    serve.add_argument("--skip-server-warmup", action="store_true", default=None,
                       help="start without the warm-up rounds that compile every kernel variant on a CUDA device "
                       "(SGLang's flag)")
    serve.add_argument("--sleep-on-idle", action="store_true", default=None,
                       help="an idle scheduler blocks on its socket instead of polling it (SGLang's flag; without it "
                       "the scheduler polls on a CUDA device, taking a request without a wake-up, and blocks on the CPU)")
    serve.add_argument("--disable-overlap-schedule", action="store_true",
                       help="run rounds one at a time (SGLang's flag; without it, on a CUDA device, the next round "
                       "is planned and launched while the GPU computes the one before)")
    serve.add_argument("--log-level-http",
                       help="uvicorn's log level, its access log at info; also trace (default: --log-level)")
    serve.add_argument("--watchdog-timeout", type=float, metavar="S",
                       help="a round running longer than S seconds takes the server down, every request answered 503 "
                       f"(SGLang's flag; default: {served.watchdog_timeout:g})")
    serve.add_argument("--enable-deterministic-inference", action="store_true", default=None,
                       help="deterministic mode: GEMMs at row counts checked bitwise at start, a question's bits independent of its round "
                       "(SGLang's flag)")
    serve.add_argument("--max-queued-requests", type=int, metavar="N",
                       help="refuse a request with 503 while N are sent to the scheduler and not yet answered "
                       "(SGLang's flag; default: no limit)")
    add_server_flags(serve)
    serve.set_defaults(func=run_serve)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "round_size", 1) < 1:
        print("flide: error: --round-size must be at least 1", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except CLIError as e:
        print(f"flide: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
