"""SGLang's own bench_serving (``sglang.benchmark.serving``) driving decision workloads:
its CLI, runner, progress bar, table and JSON-lines output, with the decision backends
and datasets of benchmark/serving/sglang_tables.py in its tables. The same command
measures a Flide server or an SGLang server (``/v1/score``), so both engines are
measured by one client.

Usage (every SGLang bench_serving flag works; ``--decision-*`` options are listed
under ``--help``)::

    python benchmark/bench_serving_sglang.py --backend decision-score --base-url http://127.0.0.1:30000 \\
        --dataset-name multirc --num-prompts 128 --max-concurrency 64 --output-file out/multirc.jsonl
    python benchmark/bench_serving_sglang.py --backend decision-text --dataset-name decisions ...

Each run appends bench_serving's JSON line to ``--output-file`` (default
``BACKEND_DATASET_NUMPROMPTS.jsonl``) with four fields added: ``decision_questions``
(questions of the requests answered), ``decision_questions_per_s`` (those over
bench_serving's ``duration``), ``decision_failed`` (requests not answered) and
``decision_keep_alive`` (whether the requests shared kept-alive connections).
Agent trajectories (closed-loop steps over a growing state) and the cold resend stay
in benchmark/bench_serving.py: bench_serving's runner sends independent requests.

Exit status: bench_serving's (2 with argparse's line for bad arguments); 1 when some
request failed, with one line naming the first failure when none succeeded (where
bench_serving itself stops at its warm-up check or cannot draw its summary) or when
bench_serving stops after failures without writing its line (a server that went away
mid-run fails its closing ``/server_info`` read too).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving import sglang_tables  # noqa: E402


class NoneAnswered(RuntimeError):
    """Every request the run sent (warm-up included) failed."""


class StoppedAfterFailures(RuntimeError):
    """bench_serving itself failed after some requests had failed (the server went
    away: its closing ``/server_info`` read fails too), before writing its line."""


def add_decision_fields(path: Path, rows: list, result: dict, keep_alive: bool = False) -> dict:
    """Rewrite the last line of ``path`` (the one bench_serving just appended) with
    the decision fields of ``result`` (bench_serving's return: ``duration`` in s and
    one ``errors`` entry per row, empty when answered); ``keep_alive``: the run's
    ``--decision-keep-alive``."""
    answered = [sglang_tables.questions_of(row.prompt) for row, err in zip(rows, result["errors"]) if not err]
    fields = {"decision_questions": sum(answered),
              "decision_questions_per_s": sum(answered) / result["duration"] if result.get("duration") else None,
              "decision_failed": len(rows) - len(answered), "decision_keep_alive": keep_alive}
    lines = path.read_text().splitlines()
    if lines:
        lines[-1] = json.dumps({**json.loads(lines[-1]), **fields})
        path.write_text("\n".join(lines) + "\n")
    print(f"{'Decision questions answered:':<40} {fields['decision_questions']}")
    if fields["decision_questions_per_s"] is not None:
        print(f"{'Decision questions/s:':<40} {fields['decision_questions_per_s']:.2f}")
    return fields


def main(argv=None) -> int:
    from sglang.benchmark import serving

    sglang_tables.register()
    loaded: list = []
    originals = serving.ArgumentParser, serving.get_dataset, serving.run_benchmark, serving.benchmark
    _, get_dataset, run_benchmark, benchmark = originals

    def keep_rows(args, tokenizer, model_id=None):
        loaded[:] = get_dataset(args, tokenizer, model_id)
        return loaded

    async def benchmark_closing(*args, **kwargs):
        # The kept-alive session belongs to this run's event loop: closed before it ends.
        try:
            return await benchmark(*args, **kwargs)
        finally:
            await sglang_tables.close_shared_session()

    outcome = {}
    sglang_tables.TALLY = sglang_tables.Tally()  # this run's requests only

    def run(args):
        if not args.output_file:
            args.output_file = f"{args.backend}_{args.dataset_name}_{args.num_prompts}.jsonl"
        Path(args.output_file).parent.mkdir(parents=True, exist_ok=True)
        tally = sglang_tables.TALLY
        sglang_tables.KEEP_ALIVE = bool(getattr(args, "decision_keep_alive", False))
        try:
            result = run_benchmark(args)
        except Exception as exc:
            if tally.sent and tally.failed == tally.sent:
                raise NoneAnswered(f"{tally.failed} of {tally.sent} requests failed, the first: {tally.first_error}")
            if tally.failed:
                raise StoppedAfterFailures(f"bench_serving stopped ({type(exc).__name__}: {exc}) after {tally.failed} "
                                           f"of {tally.sent} requests failed, the first: {tally.first_error}")
            raise
        if args.dataset_name in sglang_tables.datasets() and result is not None:
            outcome.update(add_decision_fields(Path(args.output_file), loaded, result, sglang_tables.KEEP_ALIVE))
        return result

    serving.ArgumentParser = sglang_tables.cli_parser_class()
    serving.get_dataset, serving.run_benchmark, serving.benchmark = keep_rows, run, benchmark_closing
    argv = sys.argv[1:] if argv is None else argv
    saved, sys.argv = sys.argv, [Path(__file__).name, *argv]
    try:
        serving.cli_main()
    except (NoneAnswered, StoppedAfterFailures) as exc:
        print(f"bench_serving_sglang: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    finally:
        sys.argv = saved
        serving.ArgumentParser, serving.get_dataset, serving.run_benchmark, serving.benchmark = originals
        sglang_tables.KEEP_ALIVE = False
    return 1 if outcome.get("decision_failed") else 0


if __name__ == "__main__":
    sys.exit(main())
