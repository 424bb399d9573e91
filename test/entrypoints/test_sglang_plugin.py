"""``python -m sglang.launch_server --decision-mode``: Flide through SGLang's own
launcher (the plugin is found through the ``sglang.srt.plugins`` entry point)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import requests

from flide_ext import Engine
from test.helpers.decisions import choice
from test.helpers.processes import free_port, quiet_env, wait_for_health

ENV = quiet_env()


def launch(*args, **kwargs):
    return [sys.executable, "-m", "sglang.launch_server", *args]


def test_help_lists_decision_mode():
    run = subprocess.run(launch("--help"), capture_output=True, text=True, env=ENV, timeout=300)
    assert run.returncode == 0 and "--decision-mode" in run.stdout


def test_flags_flide_cannot_honour_are_refused(char_model_dir):
    run = subprocess.run(launch("--decision-mode", "--model-path", str(char_model_dir), "--tp-size", "2",
                                "--enable-lora"), capture_output=True, text=True, env=ENV, timeout=300)
    assert run.returncode == 2
    # Refused by Flide's plugin (not by argparse, which would also exit 2).
    assert "Flide cannot honour" in run.stderr
    assert run.stderr.strip().splitlines()[-1] == \
        "--decision-mode: Flide cannot honour --enable-lora, --tp-size; remove them"


def test_a_flag_argparse_cannot_parse_is_one_line_under_decision_mode(char_model_dir):
    """SGLang's parser prints its whole usage (hundreds of lines) before an
    argparse error; under --decision-mode the error is one line, exit status 2,
    from either launcher. Without --decision-mode SGLang's own behaviour stays."""
    from pathlib import Path

    serve = [str(Path(sys.executable).parent / "sglang"), "serve"]
    for command, wanted in ((launch("--decision-mode", "--model-path", str(char_model_dir), "--bogus-flag", "1"),
                             "unrecognized arguments: --bogus-flag 1"),
                            (launch("--decision", "--model-path", str(char_model_dir), "--port", ""),  # abbreviated
                             "argument --port: invalid int value: ''"),
                            ([*serve, "--decision-mode", "--model-path", str(char_model_dir), "--port", "eighty"],
                             "argument --port: invalid int value: 'eighty'")):
        run = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)
        assert run.returncode == 2, run.stderr[-2000:]
        errors = [line for line in run.stderr.splitlines() if "error" in line]
        assert errors == [f"sglang serve: error: {wanted} (--help lists the flags)"], run.stderr[-2000:]
        assert "usage:" not in run.stderr
    plain = subprocess.run(launch("--model-path", str(char_model_dir), "--bogus-flag", "1"), capture_output=True,
                           text=True, env=ENV, timeout=300)
    assert plain.returncode == 2 and "usage:" in plain.stderr


def test_flide_flags_without_decision_mode_are_refused():
    """SGLang's own engine would ignore Flide's flags: given without
    --decision-mode they are refused in one line (exit 2) before SGLang
    configures anything; without them SGLang's path is taken as before."""
    from flide_ext.entrypoints.sglang_plugin import _around_from_cli_args, _add_flag

    parser = _sglang_parser()
    _add_flag(None, parser)
    taken = []
    plain = parser.parse_args(["--model-path", "m"])
    assert _around_from_cli_args(lambda a: taken.append(a) or "engine", plain) == "engine" and taken == [plain]
    given = parser.parse_args(["--model-path", "m", "--state-cache-gb", "2", "--round-seconds", "0.5"])
    with pytest.raises(SystemExit) as stop:
        _around_from_cli_args(lambda a: taken.append(a), given)
    assert stop.value.code == 2 and taken == [plain]
    run = subprocess.run(launch("--model-path", "m", "--max-body-mb", "lots"), capture_output=True, text=True,
                         env=ENV, timeout=300)
    assert run.returncode == 2 and run.stderr.strip().splitlines()[-1] == \
        "--max-body-mb applies to Flide's decision server only: add --decision-mode or remove it", run.stderr


def test_refused_flags_are_named_as_typed():
    """A refused flag is named as the command line gave it: an alias, an
    abbreviation argparse accepted, ``--flag=value``; given no other way, by its
    first long option string."""
    from flide_ext.entrypoints.sglang_plugin import refused_flags

    parser = _sglang_parser()
    for argv, named in ((["--tp", "2"], ["--tp"]), (["--tp-size=2"], ["--tp-size"]),
                        (["--tensor-parallel-size", "2", "--enable-lora"], ["--enable-lora", "--tensor-parallel-size"]),
                        ([], [])):
        args = parser.parse_args(["--model-path", "m", *argv])
        assert refused_flags(args, ["--model-path", "m", *argv]) == named
    args = parser.parse_args(["--model-path", "m", "--tp", "2"])
    assert refused_flags(args, []) == ["--tp-size"]


def test_a_taken_port_is_refused_before_the_model_loads(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        run = subprocess.run(launch("--decision-mode", "--model-path", str(tmp_path / "absent"), "--port", port),
                             capture_output=True, text=True, env=ENV, timeout=300)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1] == \
        f"--decision-mode: cannot listen on 127.0.0.1:{port} (--host, --port): Address already in use"


def test_launch_server_decision_mode_answers_like_the_engine(char_model_dir, tmp_path):
    """And a round past SGLang's --watchdog-timeout takes the server down: the
    request is answered 503 with why, and the launcher exits 1 with one line."""
    port = free_port()
    log = tmp_path / "server.log"
    proc = subprocess.Popen(
        launch("--decision-mode", "--model-path", str(char_model_dir), "--port", str(port), "--api-key", "k",
               "--context-length", "300", "--enable-deterministic-inference", "--watchdog-timeout", "1",
               "--residual-dtype", "model",
               "--max-prefill-tokens", "262144"),
        stdout=open(log, "w"), stderr=subprocess.STDOUT, env=ENV,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(url, proc, log)
        request = {"input": "Rain is wet.", "questions": [choice("a", 3), choice("b", 2, "Pick")]}
        got = requests.post(f"{url}/v1/decisions", json=request, headers={"Authorization": "Bearer k"}).json()
        want = Engine(str(char_model_dir), context_length=300).decide(request).model_dump(exclude_none=True)
        for qid, answer in want["answers"].items():
            for name, p in answer["probabilities"].items():
                assert abs(got["answers"][qid]["probabilities"][name] - p) <= 1e-6
        info = requests.get(f"{url}/server_info", headers={"Authorization": "Bearer k"}).json()
        assert info["decision_mode"] and info["context_length"] == 300 and info["device"] == "cpu"
        assert info["enable_deterministic_inference"] is True
        assert info["residual_dtype"] == "float32"  # a float32 model's own dtype
        # 900 prompts of 290 tokens in one round: ~10 s on a slow two-core CPU, and
        # still seconds on a fast one (200 prompts ended inside 1 s on CI's).
        heavy = {"query": [], "items": np.random.default_rng(0).integers(3, 128, (900, 290)).tolist(),
                 "label_token_ids": [1, 2]}
        r = requests.post(f"{url}/v1/score", json=heavy, headers={"Authorization": "Bearer k"}, timeout=60)
        assert r.status_code == 503 and "past the watchdog limit (--watchdog-timeout 1)" in r.json()["message"], r.text
        assert proc.wait(30) == 1
        last = log.read_text().strip().splitlines()[-1]
        assert last.startswith("--decision-mode: a round has run ") and last.endswith("; the server stopped"), last
    finally:
        proc.terminate()
        proc.wait(30)


def test_sglang_serve_decision_mode_answers_like_the_launcher(char_model_dir, tmp_path):
    """``sglang serve --decision-mode`` (SGLang's recommended launcher, which
    loads plugins before it parses) serves Flide as ``python -m
    sglang.launch_server --decision-mode`` does: the engine's answers, the plugin's
    refusals."""
    from pathlib import Path

    serve = [str(Path(sys.executable).parent / "sglang"), "serve", "--decision-mode"]
    port = free_port()
    log = tmp_path / "server.log"
    proc = subprocess.Popen([*serve, "--model-path", str(char_model_dir), "--port", str(port), "--context-length",
                             "300"], stdout=open(log, "w"), stderr=subprocess.STDOUT, env=ENV)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(url, proc, log)
        request = {"input": "Rain is wet.", "questions": [choice("a", 3), choice("b", 2, "Pick")]}
        got = requests.post(f"{url}/v1/decisions", json=request).json()
        want = Engine(str(char_model_dir), context_length=300).decide(request).model_dump(exclude_none=True)
        for qid, answer in want["answers"].items():
            for name, p in answer["probabilities"].items():
                assert abs(got["answers"][qid]["probabilities"][name] - p) <= 1e-6
        assert requests.get(f"{url}/server_info").json()["decision_mode"] is True
    finally:
        proc.terminate()
        proc.wait(30)
    run = subprocess.run([*serve, "--model-path", str(char_model_dir), "--tp", "2"], capture_output=True, text=True,
                         env=ENV, timeout=300)
    assert run.returncode == 2
    # (sglang serve logs its child-process clean-up after it.)
    assert "--decision-mode: Flide cannot honour --tp; remove it" in run.stderr.splitlines()


def test_diffusion_check_answers_no_at_once_under_decision_mode(monkeypatch):
    """``sglang serve`` asks whether the model is a diffusion model (for a name
    that is not a directory, by fetching from the model hub); under
    --decision-mode the plugin answers no without asking, otherwise SGLang's own
    check answers."""
    from flide_ext.entrypoints.sglang_plugin import _around_diffusion_check

    asked = []

    def original(path):
        asked.append(path)
        return True

    monkeypatch.setattr(sys, "argv", ["sglang", "serve", "--decision-mode", "--model-path", "smollm2-135m"])
    assert _around_diffusion_check(original, "smollm2-135m") is False and asked == []
    monkeypatch.setattr(sys, "argv", ["sglang", "serve", "--decision", "--model-path", "smollm2-135m"])
    assert _around_diffusion_check(original, "smollm2-135m") is False and asked == []  # argparse's abbreviation
    monkeypatch.setattr(sys, "argv", ["sglang", "serve", "--model-path", "org/flux"])
    assert _around_diffusion_check(original, "org/flux") is True and asked == ["org/flux"]
    monkeypatch.setattr(sys, "argv", ["sglang", "serve", "--model-path", "org/flux", "--decode-log-interval", "5"])
    assert _around_diffusion_check(original, "org/flux") is True and asked == ["org/flux"] * 2


def _sglang_parser():
    """SGLang's own launcher flags, as ``sglang.launch_server`` parses them."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser


def test_prefill_limits_become_round_capacities():
    """SGLang's --max-prefill-tokens and --max-running-requests set a round's
    token and request capacity (and are not refused); SGLang's default prefill
    limit is the round's token capacity under --decision-mode."""
    from flide_ext.server.launch import ServeArgs
    from flide_ext.entrypoints.sglang_plugin import refused_flags, serve_args

    parser = _sglang_parser()
    args = parser.parse_args(["--model-path", "m", "--device", "cpu", "--max-prefill-tokens", "5000",
                              "--max-running-requests", "7"])
    assert refused_flags(args) == []
    mapped = serve_args(args)
    assert (mapped.round_tokens, mapped.max_round_requests) == (5000, 7)
    plain = parser.parse_args(["--model-path", "m", "--device", "cpu"])
    mapped = serve_args(plain)
    assert (mapped.round_tokens, mapped.max_round_requests) == (plain.max_prefill_tokens, ServeArgs.max_round_requests)


def test_disable_cuda_graph_turns_flide_graphs_off():
    from flide_ext.entrypoints.sglang_plugin import refused_flags, serve_args

    parser = _sglang_parser()
    args = parser.parse_args(["--model-path", "m", "--device", "cuda", "--disable-cuda-graph"])
    assert refused_flags(args) == []
    assert serve_args(args).cuda_graphs == "off"
    assert serve_args(parser.parse_args(["--model-path", "m", "--device", "cuda"])).cuda_graphs is None


def test_log_levels_are_sglangs_flags():
    """SGLang's --log-level and --log-level-http reach the server (not refused);
    a level neither Python's logging nor uvicorn knows is one line before any
    process starts."""
    from flide_ext.entrypoints.sglang_plugin import refused_flags, serve_args
    from flide_ext.protocol.errors import FlideError
    from flide_ext.server.launch import _log_levels

    parser = _sglang_parser()
    args = parser.parse_args(["--model-path", "m", "--device", "cpu", "--log-level", "warning",
                              "--log-level-http", "trace"])
    assert refused_flags(args) == []
    mapped = serve_args(args)
    assert (mapped.log_level, mapped.log_level_http) == ("warning", "trace")
    assert _log_levels(mapped) == ("warning", "trace")
    plain = serve_args(parser.parse_args(["--model-path", "m", "--device", "cpu"]))
    assert _log_levels(plain) == ("info", "info")  # SGLang's default, for both
    for bad, flag in (({"log_level": "trace"}, "--log-level"), ({"log_level": "loud"}, "--log-level"),
                      ({"log_level_http": "loud"}, "--log-level-http")):
        with pytest.raises(FlideError, match=flag):
            _log_levels(replace(plain, **bad))


def test_body_limits_are_flide_flags_under_sglangs_launcher():
    """--max-body-mb and --body-read-timeout (Flide's own, SGLang has neither)
    are added to SGLang's flags and reach the server; left out, the server's
    defaults hold."""
    from flide_ext.entrypoints.sglang_plugin import _add_flag, refused_flags, serve_args
    from flide_ext.server.body_limits import body_limits
    from flide_ext.server.launch import ServeArgs

    parser = _sglang_parser()
    _add_flag(None, parser)
    args = parser.parse_args(["--model-path", "m", "--device", "cpu", "--max-body-mb", "4",
                              "--body-read-timeout", "2.5"])
    assert refused_flags(args) == []
    mapped = serve_args(args)
    assert body_limits(mapped.max_body_mb, mapped.body_read_timeout) == (4 << 20, 2.5)
    plain = serve_args(parser.parse_args(["--model-path", "m", "--device", "cpu"]))
    assert (plain.max_body_mb, plain.body_read_timeout) == (ServeArgs.max_body_mb, ServeArgs.body_read_timeout)


def test_liveness_and_queue_flags_reach_the_server():
    """SGLang's --watchdog-timeout and --max-queued-requests are mapped (SGLang's
    defaults are `flide serve`'s); Flide's --request-timeout, --heartbeat-timeout
    and --round-seconds are added to SGLang's flags."""
    from flide_ext.entrypoints.sglang_plugin import _add_flag, refused_flags, serve_args
    from flide_ext.server.launch import ServeArgs, _limits

    parser = _sglang_parser()
    _add_flag(None, parser)
    args = parser.parse_args(["--model-path", "m", "--device", "cpu", "--watchdog-timeout", "7.5",
                              "--max-queued-requests", "5", "--request-timeout", "3", "--heartbeat-timeout", "4",
                              "--round-seconds", "0.25", "--decode-log-interval", "7", "--skip-server-warmup",
                              "--sleep-on-idle", "--disable-overlap-schedule"])
    assert refused_flags(args) == []
    mapped = serve_args(args)
    assert _limits(mapped) == {"watchdog_timeout": 7.5, "max_queued_requests": 5, "request_timeout": 3.0,
                               "heartbeat_timeout": 4.0, "round_seconds": 0.25, "decode_log_interval": 7}
    assert mapped.skip_server_warmup is True and mapped.sleep_on_idle is True
    assert mapped.disable_overlap_schedule is True
    plain = serve_args(parser.parse_args(["--model-path", "m", "--device", "cpu"]))
    assert (parser.get_default("watchdog_timeout"), parser.get_default("max_queued_requests")) == \
        (ServeArgs.watchdog_timeout, ServeArgs.max_queued_requests) == (300, None)
    assert (parser.get_default("decode_log_interval"), parser.get_default("skip_server_warmup")) == \
        (ServeArgs.decode_log_interval, ServeArgs.skip_server_warmup) == (40, False)
    assert parser.get_default("sleep_on_idle") is ServeArgs.sleep_on_idle is False
    assert parser.get_default("disable_overlap_schedule") is ServeArgs.disable_overlap_schedule is False
    assert plain == replace(plain, **{k: getattr(ServeArgs("m"), k) for k in
                                      ("watchdog_timeout", "max_queued_requests", "request_timeout",
                                       "heartbeat_timeout", "round_seconds", "decode_log_interval",
                                       "skip_server_warmup", "sleep_on_idle", "disable_overlap_schedule")})


def test_deterministic_flag_reaches_the_engine():
    """--enable-deterministic-inference is Flide's deterministic mode (off by
    default); --enable-cache-report and --enable-fp32-lm-head are accepted (usage
    always reports cached tokens, the readout's logits are always float32)."""
    from flide_ext.entrypoints.cli import build_parser
    from flide_ext.entrypoints.sglang_plugin import _add_flag, refused_flags, serve_args

    parser = _sglang_parser()
    _add_flag(None, parser)
    on = parser.parse_args(["--model-path", "m", "--device", "cpu", "--enable-deterministic-inference",
                            "--enable-cache-report", "--enable-fp32-lm-head"])
    assert refused_flags(on) == [] and serve_args(on).enable_deterministic_inference is True
    assert serve_args(parser.parse_args(["--model-path", "m", "--device", "cpu"])).enable_deterministic_inference is False
    flide = build_parser().parse_args(["serve", "--model-path", "m", "--enable-deterministic-inference"])
    assert flide.enable_deterministic_inference is True


def test_residual_dtype_flag_reaches_the_server():
    """Flide's --residual-dtype is added to SGLang's flags and to `flide serve`'s;
    unset, the server leaves the model's own (float32)."""
    from flide_ext.entrypoints.cli import build_parser
    from flide_ext.entrypoints.sglang_plugin import _add_flag, refused_flags, serve_args

    parser = _sglang_parser()
    _add_flag(None, parser)
    given = parser.parse_args(["--model-path", "m", "--device", "cpu", "--residual-dtype", "model"])
    assert refused_flags(given) == [] and serve_args(given).residual_dtype == "model"
    assert serve_args(parser.parse_args(["--model-path", "m", "--device", "cpu"])).residual_dtype is None
    assert build_parser().parse_args(["serve", "--model-path", "m", "--residual-dtype", "float32"]).residual_dtype \
        == "float32"
