"""The server's state-cache flags: ``--disable-radix-cache`` through SGLang's
launcher (``--decision-mode``), ``--state-cache-gb`` and ``--mem-fraction-static``
checked in one line, and a failing flush answered, not hung."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
import requests

from flide_ext.protocol.errors import FlideError
from flide_ext.server.cache_args import GIB, RESERVE_BYTES, cache_settings, fraction_budget
from flide_ext.server.io_struct import FlushCache
from flide_ext.server.scheduler import _flush
from test.helpers.decisions import choice
from flide_ext.entrypoints.cli import main as flide_main
from test.helpers.processes import main_in_process, quiet_env, serving


@pytest.fixture(scope="module")
def uncached(char_model_dir, tmp_path_factory):
    """SGLang's launcher with --disable-radix-cache (and --enable-cache-report, accepted)."""
    yield from serving([sys.executable, "-m", "sglang.launch_server", "--decision-mode", "--model-path",
                        str(char_model_dir), "--device", "cpu", "--context-length", "400", "--disable-radix-cache",
                        "--enable-cache-report"], tmp_path_factory.mktemp("uncached"))


def test_disable_radix_cache_reports_no_cached_tokens(uncached):
    body = {"input": "Harbour log: the ferry left at nine, the gulls followed it west. " * 3,
            "questions": [choice("a", 3)]}
    answers = []
    for _ in range(3):
        r = requests.post(f"{uncached}/v1/decisions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        answers.append(r.json()["answers"])
    assert answers[0] == answers[1] == answers[2]
    score = {"query": body["input"], "items": ["x", "y"], "label_token_ids": [1, 2]}
    for _ in range(2):
        assert requests.post(f"{uncached}/v1/score", json=score).json()["usage"]["prompt_tokens_details"] == {
            "cached_tokens": 0}
    assert requests.post(f"{uncached}/flush_cache").status_code == 200  # nothing to flush, still fine
    info = requests.get(f"{uncached}/server_info").json()
    assert info["disable_radix_cache"] is True and info["state_cache_bytes"] == 0
    metrics = requests.get(f"{uncached}/metrics").text
    assert "flide_state_cache_enabled 0.0" in metrics and "flide_cached_tokens_total 0.0" in metrics


def test_bad_state_cache_gb_exits_in_one_line(char_model_dir):
    """Checked before any process starts: exit 2, one line naming the flag, from
    ``flide serve`` and from SGLang's launcher (where the plugin adds the flag)."""
    flide = [sys.executable, "-m", "flide_ext.entrypoints.cli", "serve"]
    sglang = [sys.executable, "-m", "sglang.launch_server", "--decision-mode", "--device", "cpu"]
    cases = [(flide, "0", "flide: error: --state-cache-gb 0 must be a positive number"),
             (sglang, "0", "--decision-mode: --state-cache-gb 0 must be a positive number")]
    procs = [subprocess.Popen([*command, "--model-path", str(char_model_dir), "--port", "0", "--state-cache-gb", value],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=quiet_env())
             for command, value, _ in cases]
    for (_, _, message), proc in zip(cases, procs):
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 2 and err.count("\n") == 1 and err.startswith(message), err
    # The other values through the same entry point, in this process.
    for value, message in (("-1.5", "flide: error: --state-cache-gb -1.5 must be a positive number"),
                           ("lots", "flide: error: --state-cache-gb 'lots' is not a number")):
        run = main_in_process(flide_main, "serve", "--model-path", str(char_model_dir), "--port", "0",
                              "--state-cache-gb", value)
        assert run.returncode == 2 and run.stderr.count("\n") == 1 and run.stderr.startswith(message), run.stderr


def test_cache_settings():
    assert cache_settings(False, None, None, "cpu") == ({}, None)
    assert cache_settings(True, None, None, "cpu") == ({"radix_cache": False}, None)
    assert cache_settings(False, "0.5", None, "cpu") == ({"state_cache_bytes": GIB // 2}, None)
    assert cache_settings(False, 2, 0.9, "cuda") == ({"state_cache_bytes": 2 * GIB}, None)  # --state-cache-gb wins
    assert cache_settings(False, None, "0.8", "cuda:1") == ({}, 0.8)  # sized in the scheduler, on the GPU
    refused = [((False, "nan", None, "cpu"), "--state-cache-gb 'nan' is not a finite number"),
               ((True, "1", None, "cpu"), "--disable-radix-cache"),
               ((True, None, 0.5, "cuda"), "--disable-radix-cache"),
               ((False, None, 1.5, "cuda"), "must be in (0, 1]"),
               ((False, None, 0, "cuda"), "must be in (0, 1]"),
               ((False, None, 0.5, "cpu"), "needs a CUDA device")]
    for args, message in refused:
        with pytest.raises(FlideError) as e:
            cache_settings(*args)
        assert message in str(e.value) and "\n" not in str(e.value)


def test_mem_fraction_static_budget(caplog):
    total, weights = 80 * GIB, 16 * GIB
    assert fraction_budget(0.9, total, weights) == int(0.9 * total) - weights - RESERVE_BYTES
    assert fraction_budget(0.2, total, weights) is None  # nothing left: the default, with a warning
    assert "--mem-fraction-static 0.2 leaves no state cache" in caplog.text


def test_sglang_cache_flags_map_onto_serve_args():
    from sglang.srt.server_args import ServerArgs

    from flide_ext.entrypoints.sglang_plugin import refused_flags, serve_args

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(["--model-path", "m", "--device", "cuda", "--disable-radix-cache",
                              "--mem-fraction-static", "0.7", "--enable-cache-report"])
    assert refused_flags(args) == []
    mapped = serve_args(args)
    assert (mapped.disable_radix_cache, mapped.mem_fraction_static, mapped.state_cache_gb) == (True, 0.7, None)
    plain = serve_args(parser.parse_args(["--model-path", "m", "--device", "cpu"]))
    assert (plain.disable_radix_cache, plain.mem_fraction_static, plain.state_cache_gb) == (False, None, None)


def test_a_failing_flush_is_answered():
    class Broken:
        def flush_cache(self):
            raise RuntimeError("pool is busy")

    done = _flush(Broken(), FlushCache(7))
    assert done.rid == 7 and done.error == "RuntimeError: pool is busy" and done.cache is None


@pytest.fixture(scope="module")
def small_rounds(char_model_dir, tmp_path_factory):
    """Rounds of at most 300 stream tokens, the state cache on."""
    yield from serving([sys.executable, "-m", "flide_ext.entrypoints.cli", "serve", "--model-path",
                        str(char_model_dir), "--context-length", "400", "--round-tokens", "300"],
                       tmp_path_factory.mktemp("small_rounds"))


def test_a_request_larger_than_a_round_runs_when_it_resumes(small_rounds, char_model_dir):
    """A history longer than a round is served once its earlier steps are cached
    (a round counts what a request computes: its tree less what it resumes), with
    the answers a fresh engine gives the whole prompts; after a flush the same
    request is refused with a 400 naming ``items``, and the server goes on."""
    from flide_ext import Engine
    from flide_ext.protocol.decisions import label_probabilities

    history = [(7 * i) % 90 + 5 for i in range(350)]

    def step(n: int) -> dict:
        return {"query": history[:n], "items": [[3, 4], [5]], "label_token_ids": [1, 2], "apply_softmax": True}

    first = requests.post(f"{small_rounds}/v1/score", json=step(200))
    assert first.status_code == 200, first.text  # 202 stream tokens: fits; leaves its state at 192
    later = requests.post(f"{small_rounds}/v1/score", json=step(350))  # 353 tokens, 161 once it resumes
    assert later.status_code == 200, later.text
    assert later.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 2 * 192
    fresh = Engine(str(char_model_dir), context_length=400, radix_cache=False)
    # Normalised over the labels, as the server answers apply_softmax.
    want = fresh.run_round([([history + [3, 4], history + [5]], [[1, 2]] * 2)], over_labels=[True]).answers[0]
    assert later.json()["scores"] == [label_probabilities(lp, 1.0) for lp in want]
    assert requests.post(f"{small_rounds}/flush_cache").status_code == 200
    refused = requests.post(f"{small_rounds}/v1/score", json=step(350))
    assert refused.status_code == 400 and refused.json()["param"] == "items", refused.text
    assert "353 stream tokens" in refused.json()["message"]
    assert requests.post(f"{small_rounds}/v1/score", json=step(200)).status_code == 200
