"""benchmark/bench_fidelity.py and benchmark/precision_sources.py on CPU with a
tiny hybrid model (smoke scale), and the parts they are built from."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from test.helpers import ROOT
from test.helpers.processes import main_in_process

sys.path.insert(0, str(ROOT / "benchmark"))

import bench_fidelity  # noqa: E402
import precision_sources  # noqa: E402
from fidelity import metrics, reference  # noqa: E402
from fidelity.swaps import SWAPS, swapped  # noqa: E402

TINY = ["--model", "tiny-qwen3.5", "--device", "cpu", "--requests", "2", "--scale", "0.2"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return str(tmp_path_factory.mktemp("fidelity-checkpoints"))


def test_tv_distance_and_label_distribution():
    assert metrics.tv_distance([1.0, 0.0], [0.0, 1.0]) == 1.0
    assert metrics.tv_distance([0.5, 0.5], [0.75, 0.25]) == pytest.approx(0.25)
    p = metrics.label_distribution([-1.0, -2.0, -3.0])
    assert p.sum() == pytest.approx(1.0) and np.allclose(p, metrics.label_distribution([4.0, 3.0, 2.0]))
    cmp = metrics.compare([p, p[::-1]], [p, p])
    assert cmp["tv"][0] == 0.0 and cmp["tv"][1] > 0 and cmp["argmax_equal"] == [True, False]
    with pytest.raises(ValueError, match="labels"):
        metrics.compare([p], [p[:2]])
    summary = metrics.summarize(cmp["tv"], cmp["argmax_equal"])
    assert summary["argmax_agree"] == 1 and summary["max_tv"] == cmp["tv"][1]


def test_the_reference_runs_transformers_own_gdn_functions():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    dispatched = m.torch_chunk_gated_delta_rule
    with reference.torch_gdn_path():
        assert m.torch_chunk_gated_delta_rule is dispatched.__wrapped__
    assert m.torch_chunk_gated_delta_rule is dispatched


def test_bench_fidelity_float32_flide_equals_the_reference(tmp_path, checkpoints):
    # In float32 Flide's forked rounds are the float32 forward of each prompt.
    run = main_in_process(bench_fidelity.main, *TINY, "--checkpoint-dir", checkpoints, "--dtype", "float32",
                          "--sets", "race", "multirc", "--out", str(tmp_path / "f32"))
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads((tmp_path / "f32" / "fidelity.json").read_text())
    for name in ("race", "multirc"):
        flide = results["sets"][name]["engines"]["flide"]["summary"]
        assert flide["questions"] == {"race": 8, "multirc": 60}[name]
        assert flide["max_tv"] < 1e-5 and flide["argmax_agree"] == flide["questions"]


def test_bench_fidelity_bf16_writes_table_plot_and_every_question(tmp_path, checkpoints):
    out = tmp_path / "bf16"
    run = main_in_process(bench_fidelity.main, *TINY, "--checkpoint-dir", checkpoints, "--sets", "multirc",
                          "--gdn-rule-dtype", "float32", "--out", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads((out / "fidelity.json").read_text())
    block = results["sets"]["multirc"]
    # no fla here: one transformers run
    assert set(block["engines"]) == {"flide", "flide_gdn_float32", "transformers_bfloat16"}
    seconds = results["settings"]["flide_seconds"]
    assert set(seconds) == {"flide", "flide_gdn_float32"} and all(t["multirc"] > 0 for t in seconds.values())
    for engine in block["engines"].values():
        assert len(engine["tv"]) == 60 and engine["summary"]["mean_tv"] > 0
        assert engine["summary"]["mean_tv"] == pytest.approx(np.mean(engine["tv"]))
    share = block["flide_vs_transformers_bfloat16"]["a_closer_or_equal"]
    flide, hf = np.array(block["engines"]["flide"]["tv"]), np.array(block["engines"]["transformers_bfloat16"]["tv"])
    assert share == pytest.approx(float((flide <= hf).mean()))
    assert results["settings"]["transformers_gdn"] == "torch"
    assert "| multirc | flide | 60 |" in (out / "fidelity.md").read_text() and (out / "fidelity.png").stat().st_size


def test_swaps_change_nothing_outside_their_block_and_as_is_is_the_engine(checkpoints):
    from flide_ext import Engine

    args = bench_fidelity.build_parser().parse_args([*TINY, "--checkpoint-dir", checkpoints, "--sets", "multirc"])
    path = bench_fidelity.checkpoint(args)
    groups = bench_fidelity.question_sets(args, path)["multirc"]
    engine = Engine(str(path), dtype="bfloat16", radix_cache=False)
    before = engine.run_rounds(groups).answers
    with swapped(engine.runner.model, []):
        assert engine.run_rounds(groups).answers == before
    changed = {}
    for name in SWAPS:
        with swapped(engine.runner.model, [name]):
            changed[name] = engine.run_rounds(groups).answers != before
        assert engine.run_rounds(groups).answers == before, name
    # The reference kernels CPU runs are float64 inside: those swaps change nothing here.
    assert not changed["gdn_rule"] and not changed["attention"]
    assert changed["norm_outputs"] and changed["lm_head"] and changed["gdn_gate"]
    with pytest.raises(KeyError, match="unknown swaps"):
        with swapped(engine.runner.model, ["gemm"]):
            pass


def test_precision_sources_all_swaps_come_closer_to_float32(tmp_path, checkpoints):
    out = tmp_path / "sources"
    run = main_in_process(precision_sources.main, *TINY, "--checkpoint-dir", checkpoints, "--sets", "multirc",
                          "--swaps", "norm_outputs", "lm_head", "norms", "--out", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads((out / "sources.json").read_text())
    rows = {r["run"]: r for r in results["runs"]}
    assert list(rows) == ["as is", "norm_outputs", "lm_head", "norms", "all storage swaps", "all swaps",
                          "transformers bfloat16"]
    assert rows["as is"]["share"] == 0.0
    assert rows["all swaps"]["mean_tv"] < rows["as is"]["mean_tv"]
    for row in rows.values():
        assert row["share"] == pytest.approx((rows["as is"]["mean_tv"] - row["mean_tv"]) / rows["as is"]["mean_tv"])
    assert "| norm_outputs | storage |" in (out / "sources.md").read_text() and (out / "sources.png").stat().st_size
    assert "| transformers bfloat16 | baseline |" in (out / "sources.md").read_text()
    # The baseline is transformers' own bf16 forward: the same answers bench_fidelity records for it.
    fidelity_out = tmp_path / "fidelity"
    run = main_in_process(bench_fidelity.main, *TINY, "--checkpoint-dir", checkpoints, "--sets", "multirc",
                          "--out", str(fidelity_out))
    assert run.returncode == 0, run.stderr[-2000:]
    fidelity = json.loads((fidelity_out / "fidelity.json").read_text())
    assert rows["transformers bfloat16"]["tv"] == fidelity["sets"]["multirc"]["engines"]["transformers_bfloat16"]["tv"]


def test_bad_arguments_are_one_line_and_exit_2():
    cases = [(bench_fidelity.main, ["--requests", "0"]), (bench_fidelity.main, ["--scale", "2"]),
             (bench_fidelity.main, ["--server", "sglang"]), (bench_fidelity.main, ["--model", "/no/such/model"]),
             (bench_fidelity.main, ["--out", "/no/such/dir/x"]),
             (precision_sources.main, ["--server", "a=http://127.0.0.1:1"])]
    for main, extra in cases:
        run = main_in_process(main, "--device", "cpu", *extra)
        assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, (extra, run.stderr)
    script = subprocess.run([sys.executable, str(ROOT / "benchmark" / "bench_fidelity.py"), "--requests", "0"],
                            capture_output=True, text=True, timeout=300)
    assert script.returncode == 2 and script.stderr.strip().startswith("bench_fidelity: error: --requests 0")


def test_bench_fidelity_resumes_the_sets_a_cut_run_finished(tmp_path, checkpoints):
    out = tmp_path / "resume"
    argv = [*TINY, "--checkpoint-dir", checkpoints, "--sets", "race", "multirc", "--set-requests", "race=1",
            "--out", str(out)]
    first = main_in_process(bench_fidelity.main, *argv)
    assert first.returncode == 0, first.stderr[-2000:]
    results = json.loads((out / "fidelity.json").read_text())
    whole = results["sets"]
    # --set-requests: one RACE request (4 questions) beside two MultiRC requests.
    assert whole["race"]["questions"] == 4 and whole["multirc"]["questions"] == 60
    # A run cut while Flide answered MultiRC: its RACE answers were kept, the rest never written.
    saved = json.loads((out / "answers.json").read_text())
    assert set(saved["answers"]) == {"float32", "flide", "transformers_bfloat16"}
    assert all(set(per_set) == {"race", "multirc"} for per_set in saved["answers"].values())
    del saved["answers"]["flide"]["multirc"]
    del saved["answers"]["transformers_bfloat16"]
    (out / "answers.json").write_text(json.dumps(saved))
    again = main_in_process(bench_fidelity.main, *argv)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming float32 (race, multirc), flide (race)" in again.stderr
    assert json.loads((out / "fidelity.json").read_text())["sets"] == whole
    # Other settings: nothing resumed.
    other = main_in_process(bench_fidelity.main, *[a if a != "race=1" else "race=2" for a in argv])
    assert other.returncode == 0 and "resuming" not in other.stderr


def test_bench_fidelity_records_a_failed_candidate_and_keeps_the_rest(tmp_path, checkpoints, monkeypatch):
    plain = bench_fidelity.run_flide

    def failing(path, sets, dtype, device, timings=None, label="flide", **engine_args):
        if engine_args.get("gdn_rule_dtype"):
            raise RuntimeError("out of resource: shared memory")
        return plain(path, sets, dtype, device, timings, label, **engine_args)

    monkeypatch.setattr(bench_fidelity, "run_flide", failing)
    out = tmp_path / "failed"
    run = main_in_process(bench_fidelity.main, *TINY, "--checkpoint-dir", checkpoints, "--sets", "race",
                          "--gdn-rule-dtype", "float32", "--out", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads((out / "fidelity.json").read_text())
    assert set(results["sets"]["race"]["engines"]) == {"flide", "transformers_bfloat16"}
    assert results["settings"]["errors"] == {"flide_gdn_float32": "RuntimeError: out of resource: shared memory"}
    assert set(results["settings"]["flide_seconds"]) == {"flide"}
    assert "flide_gdn_float32 failed, left out of the table" in (out / "fidelity.md").read_text()


@pytest.mark.parametrize("spec", ["quality", "quality=0", "nosuch=3", "quality=x"])
def test_bench_fidelity_refuses_a_bad_set_requests_in_one_line(spec):
    run = main_in_process(bench_fidelity.main, "--set-requests", spec)
    assert run.returncode == 2 and "--set-requests" in run.stderr and "SET=N" in run.stderr


def test_precision_sources_diagnoses_the_engine_as_configured(tmp_path, checkpoints):
    """--residual-dtype model configures the engine the diagnostic runs (its as-is
    row is then the bf16-stream engine's answers) and is recorded."""
    runs = {}
    for extra in ([], ["--residual-dtype", "model"]):
        out = tmp_path / ("model" if extra else "default")
        run = main_in_process(precision_sources.main, *TINY, "--checkpoint-dir", checkpoints, "--sets", "multirc",
                              "--swaps", "norms", *extra, "--out", str(out))
        assert run.returncode == 0, run.stderr[-2000:]
        runs[bool(extra)] = json.loads((out / "sources.json").read_text())
    assert runs[True]["settings"]["residual_dtype"] == "model" and runs[False]["settings"]["residual_dtype"] is None
    as_is = {k: next(r for r in v["runs"] if r["run"] == "as is")["tv"] for k, v in runs.items()}
    assert as_is[True] != as_is[False]
