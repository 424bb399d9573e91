"""Fidelity: every engine's answers against a float32 forward of each full prompt.

For each question set and one checkpoint, the float32 reference is a Hugging Face
transformers forward of each question's full prompt in float32 (TF32 off, its own
PyTorch GDN recurrence: ``fidelity/reference.py``). Measured against it, per
question, the TV distance of the label distribution and whether the argmax agrees:

* ``flide``: Flide's engine in ``--dtype`` (its GPU path: forked rounds, flat CUDA
  graphs, the Triton kernels), every set's requests in as few rounds as fit;
* ``transformers_bf16``: transformers in ``--dtype``, one prompt per forward, with
  the GDN kernels it picks (flash-linear-attention's when installed); and
  ``transformers_bf16_torch_gdn`` beside it when those are not its own;
* ``--server NAME=URL``: any server of SGLang's ``/v1/score`` (an SGLang or Flide
  server on the same checkpoint), one request per question group (query = the
  group's shared prefix, items = the rest of each prompt), ``apply_softmax``.

Sets (``fidelity/questions.py``): ``race``, ``race_single``, ``multirc``,
``quality`` (random tokens of the workloads' shapes) and ``examples`` (the bundled
decision requests through the model's chat template; needs a tokenizer with one).

Usage::

    python benchmark/bench_fidelity.py --model qwen3.5-4b --device cuda \\
        --sets race multirc quality --requests 16 --set-requests quality=4 --out benchmark/results/fidelity/4b
    python benchmark/bench_fidelity.py --model smollm2-135m --device cuda --sets examples \\
        --server sglang=http://127.0.0.1:30000 --out benchmark/results/fidelity/smollm2

``--model`` is a checkpoint directory, a built-in model (``smollm2-135m``) or a
random-weight shape (``tiny-qwen3.5``, ``qwen3.5-0.8b`` ... written once into
``--checkpoint-dir``). ``--out DIR`` writes ``fidelity.json`` (settings, every
question's TV per engine, the summaries), ``fidelity.md`` (the table and the
command) and ``fidelity.png``. Each engine's answers are kept per set in
``answers.json`` there as they come, and a rerun with the same settings resumes
from them. A candidate engine (``--gdn-rule-dtype``, ``--residual-dtype``) that fails is recorded, not fatal. On
CUDA, fla-core is pointed at Flide's shipped kernel configurations before anything
imports it. Exit status 0; 2 with one line on bad arguments.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fidelity import metrics, questions, reference  # noqa: E402
from fidelity.report import markdown, plot  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class BadArguments(ValueError):
    """One line for the command's refusal (exit status 2)."""


def checkpoint(args) -> Path:
    """The checkpoint directory ``--model`` names (a random-weight shape is written
    into ``--checkpoint-dir`` on first use)."""
    from flide_ext.assets.builtin_models import resolve_model_path
    from flide_ext.assets.random_checkpoints import QWEN35_SHAPES, write_random_checkpoint
    from flide_ext.protocol.errors import ModelLoadError

    if args.model in QWEN35_SHAPES or args.model == "tiny-qwen3.5":
        from bench_decision import model_config

        root = Path(args.checkpoint_dir or Path(tempfile.gettempdir()) / "flide-fidelity")
        # "untied": written since a head scale unties a tied head (older folders hold the tied one).
        head = "" if args.head_scale == 1 else f"-head{args.head_scale:g}untied"
        target = root / f"{args.model}{head}-seed{args.seed}"
        if not (target / "config.json").is_file():
            try:
                write_random_checkpoint(target, model_config(args.model), torch.bfloat16, args.seed, args.head_scale)
            except ValueError as e:
                raise BadArguments(f"--head-scale: {e}") from None
        return target
    try:
        return resolve_model_path(args.model)
    except ModelLoadError as e:
        raise BadArguments(str(e)) from None


def parse_servers(specs: list) -> dict:
    out = {}
    for spec in specs:
        name, sep, url = spec.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise BadArguments(f"--server {spec!r} is not NAME=http://HOST:PORT")
        out[name] = url
    return out


def text_config(path: Path):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path))
    return getattr(config, "text_config", None) or config


def is_hybrid(path: Path) -> bool:
    """Whether the checkpoint has Gated DeltaNet layers."""
    return "linear_attention" in (getattr(text_config(path), "layer_types", None) or [])


def transformers_baselines(path: Path, dtype_name: str) -> list:
    """``[(engine name, label, torch_gdn)]`` of the plain transformers forwards in
    ``dtype_name``: as transformers picks its GDN kernels, and beside it its own
    PyTorch GDN recurrence when those are another package's."""
    out = [(f"transformers_{dtype_name}", f"transformers {dtype_name}", False)]
    if is_hybrid(path) and reference.gdn_implementation() != "torch":
        out.append((f"transformers_{dtype_name}_torch_gdn", f"transformers {dtype_name} (torch GDN)", True))
    return out


def question_sets(args, path: Path) -> dict:
    """``{set: groups}`` for ``--sets``."""
    vocab = text_config(path).vocab_size
    sets = {}
    for name in args.sets:
        count = args.set_requests.get(name, args.requests)
        if name == "examples":
            from flide_ext.protocol.decisions import DecisionRenderer
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(path))
            if not getattr(tokenizer, "chat_template", None):
                raise BadArguments(f"--sets examples needs a chat template; {path}'s tokenizer has none")
            sets[name] = questions.example_groups(DecisionRenderer(tokenizer, 1 << 30), count)
        else:
            sets[name] = questions.token_groups(name, count, vocab, args.scale, args.seed)
    return sets


def shipped_fla_configs(device) -> str:
    """Points fla-core at Flide's shipped kernel configurations before anything
    imports it (transformers' Qwen3.5 modeling does, at import), as Flide's server
    does: else every fla kernel of every engine autotunes on first use. Says which."""
    if device.type != "cuda":
        return "none (CPU)"
    from flide_ext.kernels.fla_configs import use_shipped

    if use_shipped():
        return "Flide's shipped H200 configurations (FLA_CACHE_MODE=full), autotuned where none is shipped"
    return "fla-core's own choice (autotuned, or as FLA_CONFIG_DIR / FLA_CACHE_MODE set)"


def free(*objects) -> None:
    del objects
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_transformers(path, sets: dict, dtype, device, torch_gdn: bool, desc: str):
    """Yields ``(set, answers)`` as each set is answered."""
    model = reference.load(path, dtype, device)
    for name, groups in sets.items():
        yield name, reference.label_logprobs(model, questions.flatten(groups), device, f"{desc} {name}", torch_gdn)
    free(model)


def run_flide(path, sets: dict, dtype, device, timings: dict = None, label: str = "flide", **engine_args):
    """Yields ``(set, answers)`` as each set is answered."""
    # Each set's rounds run twice: the answers of the first, the wall time of the
    # second (compiled, autotuned, graphs warm) into ``timings[label][set]``.
    from flide_ext import Engine

    engine = Engine(str(path), dtype=dtype, device=device, radix_cache=False, **engine_args)
    for name, groups in sets.items():
        result = engine.run_rounds(groups)
        answers = [lp for a in result.answers for lp in a]
        if timings is not None:
            start = time.perf_counter()
            again = engine.run_rounds(groups)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            timings.setdefault(label, {})[name] = time.perf_counter() - start
            if [lp for a in again.answers for lp in a] != answers:
                raise RuntimeError(f"{label}: set {name!r} answered differently the second time")
        yield name, answers
    free(engine)


def run_server(url: str, sets: dict):
    """Yields ``(set, answers)`` as each set is answered."""
    import requests

    for name, groups in sets.items():
        answers = []
        for prompts, labels in groups:
            if any(lab != labels[0] for lab in labels):
                raise BadArguments(f"set {name!r} has questions over different labels: /v1/score takes one label list")
            shared = min(len(os.path.commonprefix(prompts)), min(len(p) for p in prompts) - 1)
            body = {"query": prompts[0][:shared], "items": [p[shared:] for p in prompts],
                    "label_token_ids": labels[0], "apply_softmax": True}
            r = requests.post(f"{url.rstrip('/')}/v1/score", json=body, timeout=600)
            r.raise_for_status()
            answers += [np.log(np.maximum(np.asarray(s, np.float64), 1e-300)).tolist() for s in r.json()["scores"]]
        yield name, answers


RESUME_KEYS = ("model", "sets", "requests", "set_requests", "scale", "seed", "dtype", "head_scale", "device")


class Answers:
    """Every engine's label log-probabilities per set, kept in ``DIR/answers.json``
    after each set an engine answers (``DIR`` None: in memory only). A file written
    under other settings (:data:`RESUME_KEYS`) is set aside, not resumed."""

    def __init__(self, directory, settings: dict):
        self.path = Path(directory) / "answers.json" if directory else None
        self.settings = json.loads(json.dumps(settings))
        self.answers, self.timings = {}, {}
        if self.path is not None and self.path.is_file():
            saved = json.loads(self.path.read_text())
            if saved.get("settings") == self.settings:
                self.answers, self.timings = saved["answers"], saved.get("flide_seconds", {})
                done = ", ".join(f"{e} ({', '.join(per_set)})" for e, per_set in self.answers.items())
                print(f"bench_fidelity: resuming {done} from {self.path}", file=sys.stderr)

    def complete(self, engine: str, sets) -> bool:
        return all(s in self.answers.get(engine, {}) for s in sets)

    def run(self, engine: str, sets: dict, answer) -> None:
        """``answer(missing sets)`` yields ``(set, answers)``; each is kept as it comes."""
        missing = {s: g for s, g in sets.items() if s not in self.answers.get(engine, {})}
        if not missing:
            return
        for name, answers in answer(missing):
            self.answers.setdefault(engine, {})[name] = answers
            if self.path is not None:
                self.path.parent.mkdir(exist_ok=True)
                self.path.write_text(json.dumps({"settings": self.settings, "answers": self.answers,
                                                 "flide_seconds": self.timings}))


def evaluate(args) -> dict:
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    fla_configs = shipped_fla_configs(device)
    servers = parse_servers(args.server)
    path = checkpoint(args)
    sets = question_sets(args, path)
    hybrid = is_hybrid(path)

    # Each engine's answers are kept in --out as soon as it finishes, and a run
    # with the same settings resumes from them: on a fresh GPU machine one engine's
    # start (kernel compiles, fla-core's autotuning, graph capture) can take minutes.
    kept = Answers(args.out, {k: getattr(args, k) for k in RESUME_KEYS})
    timings, errors = kept.timings, {}
    kept.run("float32", sets, lambda todo: run_transformers(path, todo, torch.float32, device, True,
                                                            "float32 reference"))
    kept.run("flide", sets, lambda todo: run_flide(path, todo, dtype, device, timings))
    for name, label, torch_gdn in transformers_baselines(path, args.dtype):
        kept.run(name, sets, lambda todo, label=label, torch_gdn=torch_gdn: run_transformers(
            path, todo, dtype, device, torch_gdn, label))
    candidates = []
    if hybrid and args.gdn_rule_dtype:
        candidates.append((f"flide_gdn_{args.gdn_rule_dtype}", {"gdn_rule_dtype": args.gdn_rule_dtype}))
    if args.residual_dtype:
        candidates.append((f"flide_residual_{args.residual_dtype}", {"residual_dtype": args.residual_dtype}))
    for label, engine_args in candidates:
        # Candidates run last: a failure (a kernel that cannot take the dtype) is
        # recorded, and every other engine's answers still make the table.
        try:
            kept.run(label, sets, lambda todo, label=label, engine_args=engine_args: run_flide(
                path, todo, dtype, device, timings, label, **engine_args))
        except Exception as e:  # noqa: BLE001
            errors[label] = f"{type(e).__name__}: {e}"[:500]
            print(f"bench_fidelity: {label} failed: {errors[label]}", file=sys.stderr)
            free()
    for name, url in servers.items():
        kept.run(name, sets, lambda todo, url=url: run_server(url, todo))
    answers = {e: a for e, a in kept.answers.items() if kept.complete(e, sets)}

    ref = {s: [metrics.label_distribution(lp) for lp in answers["float32"][s]] for s in sets}
    engines = [e for e in answers if e != "float32"]
    results = {"sets": {}, "engines": engines}
    baseline = f"transformers_{args.dtype}"
    for s in sets:
        per_engine = {}
        for e in engines:
            cmp = metrics.compare([metrics.label_distribution(lp) for lp in answers[e][s]], ref[s])
            per_engine[e] = {"summary": metrics.summarize(cmp["tv"], cmp["argmax_equal"]), **cmp}
        flide_vs = metrics.head_to_head(per_engine["flide"]["tv"], per_engine[baseline]["tv"])
        results["sets"][s] = {"questions": len(ref[s]), "engines": per_engine,
                              f"flide_vs_{baseline}": flide_vs}
    results["settings"] = {"model": args.model, "checkpoint": str(path), "dtype": args.dtype, "device": str(device),
                           "sets": args.sets, "requests": args.requests, "scale": args.scale, "seed": args.seed,
                           "head_scale": args.head_scale, "servers": servers,
                           "set_requests": args.set_requests, "gdn_rule_dtype": args.gdn_rule_dtype,
                           "residual_dtype": args.residual_dtype,
                           "flide_seconds": {e: t for e, t in timings.items() if e in answers},
                           "fla_configs": fla_configs, "errors": errors,
                           "transformers_gdn": reference.gdn_implementation() if hybrid else None,
                           "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None}
    return results


def set_requests(text: str) -> dict:
    """``"quality=4,race=8"`` as ``{"quality": 4, "race": 8}`` (argparse type)."""
    out = {}
    for item in text.split(","):
        name, sep, count = item.partition("=")
        if not sep or name not in questions.SETS or not count.isdigit() or int(count) < 1:
            raise argparse.ArgumentTypeError(f"{item!r} is not SET=N with SET one of {', '.join(questions.SETS)} "
                                             "and N at least 1")
        out[name] = int(count)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="checkpoint directory, built-in model or random shape")
    p.add_argument("--head-scale", type=float, default=1.0, help="random shapes: LM head init scale")
    p.add_argument("--checkpoint-dir", help="random shapes: where their checkpoints are written")
    p.add_argument("--sets", nargs="+", default=["race", "multirc", "quality"], choices=questions.SETS)
    p.add_argument("--requests", type=int, default=16, help="requests per set (examples: at most this many)")
    p.add_argument("--set-requests", type=set_requests, default={}, metavar="SET=N[,SET=N]",
                   help="requests of these sets instead of --requests (e.g. quality=4)")
    p.add_argument("--scale", type=float, default=1.0, help="random sets: state and question lengths times this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bfloat16", choices=list(DTYPES), help="Flide's and the baseline's dtype")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--gdn-rule-dtype", choices=["float32"], default=None,
                   help="hybrid models: also run Flide with its gated delta rule in this dtype")
    p.add_argument("--residual-dtype", choices=["model"], default=None,
                   help="also run Flide with its residual stream in this dtype (model: the model's, as a plain "
                   "forward; Flide's default is float32)")
    p.add_argument("--server", action="append", default=[], help="NAME=URL of a /v1/score server (repeatable)")
    p.add_argument("--out", help="directory for fidelity.json, .md and .png")
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.requests < 1:
            raise BadArguments(f"--requests {args.requests} must be at least 1")
        if not 0 < args.scale <= 1:
            raise BadArguments(f"--scale {args.scale} must be in (0, 1]")
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            raise BadArguments(f"--device {args.device}: no CUDA device here")
        if args.out and not Path(args.out).parent.is_dir():
            raise BadArguments(f"--out {args.out}: its parent directory does not exist")
        parse_servers(args.server)
        results = evaluate(args)
    except BadArguments as e:
        print(f"bench_fidelity: error: {e}", file=sys.stderr)
        return 2
    results["command"] = "python benchmark/bench_fidelity.py " + " ".join(argv if argv is not None else sys.argv[1:])
    table = markdown(results)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(exist_ok=True)
        (out / "fidelity.json").write_text(json.dumps(results, indent=1))
        (out / "fidelity.md").write_text(table)
        plot(results, out / "fidelity.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
