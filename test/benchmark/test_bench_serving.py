"""benchmark/bench_serving.py against Flide's real server on CPU (a tiny random Llama):
the agent and a fresh-state workload over /v1/score, the cold resend, the report
files, compare.py, and a one-line error when no server answers."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys

import pytest

from test.helpers import ROOT
from test.helpers.processes import free_port, quiet_env, serving

SCRIPT = ROOT / "benchmark" / "bench_serving.py"
COMPARE = ROOT / "benchmark" / "serving" / "compare.py"
VOCAB = "100"  # the character tokenizer's ids (the model's vocabulary is 128)


@pytest.fixture(scope="module")
def server(char_model_dir, tmp_path_factory):
    yield from serving([sys.executable, "-m", "flide_ext.entrypoints.cli", "serve", "--model-path", str(char_model_dir),
                        "--context-length", "400"], tmp_path_factory.mktemp("bench_server"))


@pytest.fixture(scope="module")
def bench_serving():
    """The script as a module, run in this process (torch and the workload generators
    are imported once, not per run)."""
    spec = importlib.util.spec_from_file_location("bench_serving", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_probabilities(record, items: int, labels: int):
    """A warm answer exists: one probability row per item over the labels, summing to 1."""
    assert record["status"] == 200 and record["error"] is None
    scores = record["scores"]
    assert isinstance(scores, list) and len(scores) == items
    for row in scores:
        assert len(row) == labels and all(isinstance(p, float) and 0.0 <= p <= 1.0 for p in row)
        assert math.isclose(sum(row), 1.0, abs_tol=1e-6)


def assert_cold_check(cold, total: int):
    """Every answer resent alone: a count of bitwise-equal answers, after a flush or
    with the server's 404 for /flush_cache reported."""
    assert cold["total"] == total and cold["failed"] == 0 and 0 <= cold["equal"] <= total
    assert cold["flushed"] or cold["flush_status"] == 404
    assert cold["max_abs_diff"] is not None and cold["max_abs_diff"] >= 0.0


def test_agent_workload(server, bench_serving, tmp_path, capsys):
    out = tmp_path / "flide"
    rc = bench_serving.main(["--url", server, "--label", "flide", "--workload", "agent", "--agents", "2", "--steps",
                             "3", "--start", "20", "--growth", "5", "--criteria", "3", "--criteria-tokens", "4",
                             "--labels", "2", "--vocab", VOCAB, "--check-cold", "--check-protocol", "--out", str(out),
                             "--name", "agent"])
    assert rc == 0, capsys.readouterr().err[-3000:]
    result = json.loads((out / "agent.json").read_text())
    records = result["records"]
    assert len(records) == 6 and {(r["agent"], r["step"]) for r in records} == {(a, s) for a in (0, 1) for s in range(3)}
    for r in records:
        assert r["query_tokens"] == 20 + 5 * r["step"] and r["items"] == 3 and r["latency_ms"] > 0
        assert r["prompt_tokens"] == 3 * (r["query_tokens"] + 4)  # Flide's usage: every query+item prompt
        assert_probabilities(r, 3, 2)
    summary = result["summary"]
    assert summary["first_step"]["n"] == 2 and summary["later_steps"]["n"] == 4 and summary["failed"] == 0
    assert summary["decisions"] == 18 and summary["decisions_per_s"] > 0 and summary["wall_s"] > 0
    ends = sorted(r["start_s"] + r["latency_ms"] / 1e3 for r in records)
    first_done = max(r["start_s"] + r["latency_ms"] / 1e3 for r in records if r["step"] == 0)
    after = [e for e in ends if e > first_done]
    assert summary["decisions_per_s_after_first_steps"] == pytest.approx(3 * len(after) / (ends[-1] - first_done))
    assert [s["step"] for s in summary["per_step"]] == [0, 1, 2]
    assert [s["history_tokens"] for s in summary["per_step"]] == [20, 25, 30]
    assert result["label"] == "flide" and result["settings"]["agents"] == 2 and result["settings"]["vocab"] == 100
    assert result["metrics"]["before"]["status"] == 200  # Flide's /metrics: the token counters
    assert result["metrics"]["delta"]["flide_prompt_tokens_total"] == sum(r["prompt_tokens"] for r in records)
    assert result["protocol_check"] == {"checked": True, "problems": []}  # SGLang's own models accept both sides
    assert_cold_check(result["cold_check"], 6)
    # Every timed request passed through every server stage once; the stages'
    # means are in the report.
    delta = result["metrics"]["delta"]
    for stage in ("tokenize", "queue", "plan", "forward", "finish", "transport", "respond"):
        assert delta[f'flide_per_stage_req_latency_seconds_count{{stage="{stage}"}}'] == 6
    means = bench_serving.report.stage_means(delta)
    assert list(means) == ["tokenize", "queue", "plan", "forward", "finish", "transport", "respond"]
    assert all(v >= 0 for v in means.values()) and means["forward"] > 0
    # Together they are at most the client's latency (which also holds HTTP).
    served = bench_serving.report.server_latency(delta)
    assert sum(means.values()) <= served <= sum(r["latency_ms"] for r in records) / len(records)
    text = (out / "agent.md").read_text()
    assert "--workload agent" in text and "Cold check" in text and "Server side, mean ms per request" in text and (out / "agent.png").stat().st_size > 0

    # The same run's JSON twice through compare.py: ratios of 1.
    cmp = subprocess.run([sys.executable, str(COMPARE), str(out / "agent.json"), str(out / "agent.json"), "--out",
                          str(tmp_path / "cmp" / "agent")], capture_output=True, text=True, timeout=120)
    assert cmp.returncode == 0, cmp.stderr[-2000:]
    table = (tmp_path / "cmp" / "agent.md").read_text()
    assert "| decisions/s |" in table and "1.00" in table and (tmp_path / "cmp" / "agent.png").stat().st_size > 0


def test_fresh_workload(server, bench_serving, tmp_path, capsys):
    out = tmp_path / "fresh"
    rc = bench_serving.main(["--url", server, "--label", "flide", "--workload", "race", "--scale", "0.05", "--requests",
                             "3", "--concurrency", "1", "2", "--vocab", VOCAB, "--warmup", "1", "--check-cold",
                             "--out", str(out)])
    assert rc == 0, capsys.readouterr().err[-3000:]
    result = json.loads((out / "race.json").read_text())
    records = result["records"]
    assert len(records) == 6 and sorted(r["request"] for r in records) == list(range(6))
    assert [r["concurrency"] for r in records] == [1, 1, 1, 2, 2, 2]
    for r in records:  # RACE-like: 4 questions, 4 labels, a fresh state each
        assert r["items"] == 4 and r["query_tokens"] == int(375 * 0.05)
        assert_probabilities(r, 4, 4)
    assert len({json.dumps(r["scores"]) for r in records}) == 6  # fresh states, distinct answers
    summary = result["summary"]
    assert [row["concurrency"] for row in summary] == [1, 2]
    for row in summary:
        assert row["requests"] == 3 and row["failed"] == 0 and row["questions"] == 12 and row["questions_per_s"] > 0
        assert row["latency"]["p50_ms"] <= row["latency"]["p90_ms"] <= row["latency"]["p99_ms"]
    assert_cold_check(result["cold_check"], 6)
    assert (out / "race.md").exists() and (out / "race.png").stat().st_size > 0


def test_no_server_is_one_line():
    run = subprocess.run([sys.executable, str(SCRIPT), "--url", f"http://127.0.0.1:{free_port()}", "--workload",
                          "agent", "--vocab", VOCAB], capture_output=True, text=True, env=quiet_env(), timeout=120)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "no server at" in lines[0], run.stderr


def test_decisions_after_first_steps_counts_the_phase_once_every_first_step_ended(bench_serving):
    # Two agents: first steps end at 1.0 and 3.0 s; later answers at 2.0 (before
    # the phase: not counted), 4.0 and 5.0 s: 2 x 10 criteria over 2 s.
    r = lambda step, start, ms: {"step": step, "start_s": start, "latency_ms": ms, "items": 10}  # noqa: E731
    records = [r(0, 0.0, 1000), r(0, 0.0, 3000), r(1, 1.0, 1000), r(1, 3.0, 1000), r(2, 4.0, 1000)]
    assert bench_serving.report.after_first_steps(records) == pytest.approx(10.0)
    assert bench_serving.report.after_first_steps(records[:2]) is None  # nothing after the first steps
    assert bench_serving.report.after_first_steps([]) is None


def test_http_floor_probes_the_routes_without_the_scheduler(server, tmp_path, capsys):
    """benchmark/serving/http_floor.py: every probe answered and timed, each with a
    fresh session per request and over a kept one; the refused score body is
    refused (400) without a round."""
    import requests

    spec = importlib.util.spec_from_file_location("http_floor", ROOT / "benchmark" / "serving" / "http_floor.py")
    floor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floor)
    method, url, body = floor._request("refused_score", server, 30)
    refused = requests.post(url, json=body, timeout=30)
    assert refused.status_code == 400 and "label_token_ids" in refused.text
    out = tmp_path / "floor.json"
    assert floor.main(["--url", server, "--label", "flide", "--requests", "5", "--score-tokens", "30",
                       "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["probe"], r["session"]) for r in rows] == [(p, s) for p in floor.PROBES
                                                          for s in ("per request", "kept")]
    assert all(r["requests"] == 5 and 0 < r["p50_ms"] <= r["p90_ms"] for r in rows)
    assert "refused_score" in capsys.readouterr().out
    assert floor.main(["--url", "http://127.0.0.1:9", "--requests", "1"]) == 1
