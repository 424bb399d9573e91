"""benchmark/bench_serving_sglang.py (SGLang's own bench_serving with the decision
backends and datasets in its tables) against Flide's real server on CPU: a
``/v1/score`` dataset, the ``/v1/decisions`` text dataset, refused requests counted
as failures, and argparse's line for a backend that does not fit the dataset."""

from __future__ import annotations

import importlib.util
import json
import re
import sys

import pytest

from test.helpers import ROOT
from test.helpers.processes import serving

SCRIPT = ROOT / "benchmark" / "bench_serving_sglang.py"
CONTEXT = 400


@pytest.fixture(scope="module")
def server_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("sglang_bench_server")


@pytest.fixture(scope="module")
def server(char_model_dir, server_dir):
    yield from serving([sys.executable, "-m", "flide_ext.entrypoints.cli", "serve", "--model-path", str(char_model_dir),
                        "--context-length", str(CONTEXT)], server_dir)


@pytest.fixture(scope="module")
def runner():
    spec = importlib.util.spec_from_file_location("bench_serving_sglang", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(runner, server, model_dir, out, *args):
    rc = runner.main(["--base-url", server, "--model", str(model_dir), "--output-file", str(out),
                      "--disable-tqdm", *args])
    lines = out.read_text().splitlines()
    assert len(lines) == 1
    return rc, json.loads(lines[0])


def test_score_dataset(runner, server, char_model_dir, tmp_path):
    from serving.traffic import fresh_requests
    from transformers import AutoTokenizer

    rc, line = run(runner, server, char_model_dir, tmp_path / "race.jsonl", "--backend", "decision-score",
                   "--dataset-name", "race", "--num-prompts", "6", "--max-concurrency", "3",
                   "--decision-scale", "0.1", "--seed", "5")
    assert rc == 0
    bodies = fresh_requests("race", 6, len(AutoTokenizer.from_pretrained(char_model_dir)), 0.1, 5)
    assert line["backend"] == "decision-score" and line["dataset_name"] == "race" and line["completed"] == 6
    assert line["total_input_tokens"] == sum(len(b["query"]) + sum(map(len, b["items"])) for b in bodies)
    assert line["decision_questions"] == sum(len(b["items"]) for b in bodies) and line["decision_failed"] == 0
    assert line["decision_questions_per_s"] == pytest.approx(line["decision_questions"] / line["duration"])
    assert line["total_output_tokens"] == 0 and 0 < line["median_e2e_latency_ms"] <= line["p99_e2e_latency_ms"]
    assert line["server_info"]["decision_mode"] is True


def _score_ports(log) -> list:
    # The client ports of the access log's /v1/score lines, in order.
    return re.findall(r"127\.0\.0\.1:(\d+) - \"POST /v1/score", log.read_text())


@pytest.mark.parametrize("keep_alive", [True, False])
def test_keep_alive_reuses_connections(runner, server, server_dir, char_model_dir, tmp_path, keep_alive):
    """--decision-keep-alive: the run's requests (its warm-up included) share at most
    one connection per concurrent client; without it each request has its own."""
    before = len(_score_ports(server_dir / "server.log"))
    flag = ["--decision-keep-alive"] if keep_alive else []
    rc, line = run(runner, server, char_model_dir, tmp_path / "ka.jsonl", "--backend", "decision-score",
                   "--dataset-name", "race", "--num-prompts", "12", "--max-concurrency", "3",
                   "--decision-scale", "0.1", *flag)
    assert rc == 0 and line["completed"] == 12 and line["decision_failed"] == 0
    assert line["decision_keep_alive"] is keep_alive
    ports = _score_ports(server_dir / "server.log")[before:]
    assert len(ports) == 13  # bench_serving's warm-up request, then the 12
    assert len(set(ports)) <= 3 if keep_alive else len(set(ports)) == 13
    assert runner.sglang_tables._shared is None and runner.sglang_tables.KEEP_ALIVE is False


def test_text_dataset(runner, server, char_model_dir, tmp_path):
    rc, line = run(runner, server, char_model_dir, tmp_path / "decisions.jsonl", "--backend", "decision-text",
                   "--dataset-name", "decisions", "--num-prompts", "4", "--max-concurrency", "2",
                   "--decision-state-tokens", "30", "--decision-questions", "3", "--decision-options", "2")
    assert rc == 0
    assert line["completed"] == 4 and line["decision_questions"] == 12 and line["decision_failed"] == 0
    assert line["decision_questions_per_s"] > 0


@pytest.mark.parametrize("warmup", ["1", "0"])
def test_none_answered_is_one_line(runner, server, char_model_dir, tmp_path, capsys, warmup):
    # RACE's state at twice its length (about 750 tokens) passes the 400-token context:
    # bench_serving stops at its warm-up check (1) or cannot draw its summary (0).
    rc = runner.main(["--base-url", server, "--model", str(char_model_dir), "--output-file", str(tmp_path / "x"),
                      "--disable-tqdm", "--backend", "decision-score", "--dataset-name", "race_single",
                      "--num-prompts", "3", "--decision-scale", "2", "--warmup-requests", warmup])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1
    sent = 1 if warmup == "1" else 3
    assert err[-1].startswith(f"bench_serving_sglang: {sent} of {sent} requests failed, the first: 400 Bad Request")
    assert "context" in err[-1]


def test_backend_must_fit_the_dataset(runner, capsys):
    with pytest.raises(SystemExit) as exit_:
        runner.main(["--backend", "decision-text", "--dataset-name", "multirc"])
    assert exit_.value.code == 2
    assert "--dataset-name multirc goes with --backend decision-score" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # the flag has no effect on bench_serving's own backends
        runner.main(["--backend", "sglang", "--dataset-name", "random", "--decision-keep-alive"])
    assert exit_.value.code == 2
    assert "--decision-keep-alive applies to the decision backends" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        runner.main(["--help"])
    backends = re.search(r"--backend \{([^}]*)\}", capsys.readouterr().out).group(1).split(",")
    assert backends.count("decision-score") == backends.count("decision-text") == 1  # listed once each


def test_kept_alive_connections_close_before_the_servers_do(runner):
    """An idle kept-alive connection is dropped by the client before uvicorn's
    default keep-alive would close it under a request (aiohttp does not resend a POST)."""
    import asyncio

    import uvicorn

    async def connector_idle_s():
        runner.sglang_tables.KEEP_ALIVE = True
        try:
            async with runner.sglang_tables._client_session() as session:
                idle = session.connector._keepalive_timeout
            await runner.sglang_tables.close_shared_session()
            return idle
        finally:
            runner.sglang_tables.KEEP_ALIVE = False

    idle = asyncio.run(connector_idle_s())
    assert idle == runner.sglang_tables.KEEP_ALIVE_IDLE_S < uvicorn.Config(app=None).timeout_keep_alive


def test_bench_serving_stopping_after_failures_is_one_line(runner, server, char_model_dir, tmp_path, capsys,
                                                           monkeypatch):
    """bench_serving failing after some requests failed (a server gone mid-run fails its
    closing /server_info read) is one line naming both, exit 1, not a traceback."""
    from sglang.benchmark import serving

    def gone_mid_run(args):
        runner.sglang_tables.TALLY.add(serving.RequestFuncOutput(success=True))
        runner.sglang_tables.TALLY.add(serving.RequestFuncOutput(success=False, error="Connection refused"))
        raise ConnectionError("/server_info: connection refused")

    monkeypatch.setattr(serving, "run_benchmark", gone_mid_run)
    rc = runner.main(["--base-url", server, "--model", str(char_model_dir), "--output-file", str(tmp_path / "x"),
                      "--disable-tqdm", "--backend", "decision-score", "--dataset-name", "race", "--num-prompts", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and err[-1] == ("bench_serving_sglang: bench_serving stopped (ConnectionError: /server_info: "
                                   "connection refused) after 1 of 2 requests failed, the first: Connection refused")


def test_compare_reads_json_lines(runner, server, char_model_dir, tmp_path):
    spec = importlib.util.spec_from_file_location("compare", ROOT / "benchmark" / "serving" / "compare.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    paths = []
    for tag in ("first", "second"):
        out = tmp_path / tag / "multirc.jsonl"
        for clients in ("1", "3"):
            rc = runner.main(["--base-url", server, "--model", str(char_model_dir), "--output-file", str(out),
                              "--disable-tqdm", "--backend", "decision-score", "--dataset-name", "multirc",
                              "--num-prompts", "3", "--max-concurrency", clients, "--decision-scale", "0.05",
                              "--tag", tag])
            assert rc == 0
        paths.append(out)
    lines = [[json.loads(line) for line in p.read_text().splitlines()] for p in paths]
    assert compare.main([str(paths[0]), str(paths[1]), "--out", str(tmp_path / "cmp")]) == 0
    table = (tmp_path / "cmp.md").read_text()
    assert table.startswith("# first vs second: multirc")
    for i, clients in enumerate((1, 3)):
        a, b = lines[0][i], lines[1][i]
        assert a["max_concurrency"] == clients
        assert (f"| {clients} clients p50 ms | {a['median_e2e_latency_ms']:,.1f} | {b['median_e2e_latency_ms']:,.1f} | "
                f"{b['median_e2e_latency_ms'] / a['median_e2e_latency_ms']:,.2f} (second/first) |") in table
        qa, qb = a["decision_questions_per_s"], b["decision_questions_per_s"]
        assert f"| {clients} clients questions/s | {qa:,.1f} | {qb:,.1f} | {qa / qb:,.2f} (first/second) |" in table
    assert (tmp_path / "cmp.png").stat().st_size > 0
