"""``flide decide``, run as a user runs it."""

from __future__ import annotations

import json
import re

from test.helpers.decisions import EXAMPLE_DECISIONS
from flide_ext.entrypoints.cli import main as flide_main
from test.helpers.processes import flide, main_in_process


def test_main_job_on_the_bundled_examples(tmp_path, smollm2_engine):
    out = tmp_path / "answers.jsonl"
    run = flide("decide", "--model", "smollm2-135m", "--input", str(EXAMPLE_DECISIONS), "--output", str(out))
    assert run.returncode == 0, run.stderr
    entries = [json.loads(line) for line in EXAMPLE_DECISIONS.read_text().splitlines()]
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(entries) >= 20 and [a["id"] for a in answers] == [e["id"] for e in entries]
    correct = total = 0
    for entry, answer in zip(entries, answers):
        got = answer["response"]["answers"]
        assert list(got) == [q["id"] for q in entry["request"]["questions"]]
        for qid, want in entry["expected"].items():
            probs = got[qid]["probabilities"]
            total += 1
            correct += max(probs, key=probs.get) == str(want)
    match = re.search(r"accuracy: (\d+)/(\d+)", run.stderr)
    assert match and (int(match[1]), int(match[2])) == (correct, total), run.stderr
    tokens = re.search(r"tokens: (\d+) in flat streams vs (\d+) in per-question prompts", run.stderr)
    assert tokens and int(tokens[1]) < int(tokens[2])


def test_refused_lines_are_reported_and_the_rest_answered(tmp_path, char_model_dir):
    lines = [
        json.dumps({"id": "good", "request": {"input": "Sky", "questions": [
            {"id": "c", "type": "choice", "question": "Colour?", "options": [{"name": "blue"}, {"name": "red"}]}]}}),
        "{not json",
        json.dumps({"id": "dup", "request": {"input": "Sky", "questions": [
            {"id": "c", "type": "choice", "question": "?", "options": [{"name": "a"}, {"name": "b"}]},
            {"id": "c", "type": "choice", "question": "?", "options": [{"name": "a"}, {"name": "b"}]}]}}),
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    run = flide("decide", "--model", str(char_model_dir), "--input", str(src))
    assert run.returncode == 1
    out = [json.loads(line) for line in run.stdout.splitlines()]
    assert [o["id"] for o in out] == ["good", "line-2", "dup"]
    assert set(out[0]["response"]["answers"]) == {"c"}
    assert out[1]["error"]["field"] == "line 2"
    assert out[2]["error"]["field"] == "questions"
    assert "1 answered, 2 refused" in run.stderr
    # The progress bar counts every input line, the unreadable one too.
    bar = [part for part in run.stderr.replace("\r", "\n").splitlines() if part.startswith("decide:")]
    assert bar and "3/3" in bar[-1]


def test_unknown_model_is_one_line_and_exit_2(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("{}\n")
    run = flide("decide", "--model", str(tmp_path / "nope"), "--input", str(src))
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and run.stderr.startswith("flide: error: model ")


def test_missing_input_file_is_one_line_and_exit_2(tmp_path, char_model_dir):
    run = flide("decide", "--model", str(char_model_dir), "--input", str(tmp_path / "missing.jsonl"))
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "--input" in run.stderr


def test_odd_input_files(tmp_path, char_model_dir):
    good = {"input": "Sky \u2028 line", "questions": [
        {"id": "c", "type": "choice", "question": "Colour?", "options": [{"name": "blue"}, {"name": "red"}]}]}
    src = tmp_path / "in.jsonl"
    lines = [
        json.dumps({"id": "sep", "request": good}, ensure_ascii=False),  # raw U+2028 inside a string
        json.dumps({"id": "bad-expected", "request": good, "expected": ["blue"]}),
        "[" * 5000 + "]" * 5000,
    ]
    src.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode("utf-8") + b"\n")  # BOM, CRLF
    run = flide("decide", "--model", str(char_model_dir), "--input", str(src))
    out = [json.loads(line) for line in run.stdout.splitlines()]
    assert [o["id"] for o in out] == ["sep", "bad-expected", "line-3"], run.stderr
    assert "response" in out[0]
    assert out[1]["error"]["field"] == "expected"
    assert out[2]["error"]["field"] == "line 3"
    assert run.returncode == 1


def test_failed_start_leaves_the_output_alone(tmp_path, char_model_dir):
    src, dst = tmp_path / "in.jsonl", tmp_path / "old.jsonl"
    src.write_text("{}\n")
    dst.write_text("keep me\n")
    cases = (["--model", str(tmp_path / "nope")], ["--model", str(char_model_dir), "--device", "bogus"],
             ["--model", str(char_model_dir), "--context-length", "-5"])
    for i, args in enumerate(cases):  # the first as a user runs it, the others in process
        run = (flide if i == 0 else lambda *a: main_in_process(flide_main, *a))(
            "decide", *args, "--input", str(src), "--output", str(dst))
        assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert dst.read_text() == "keep me\n"
    (tmp_path / "latin1.jsonl").write_bytes(b"\xff\xfe{}")
    run = flide("decide", "--model", str(char_model_dir), "--input", str(tmp_path / "latin1.jsonl"))
    assert run.returncode == 2 and "not UTF-8" in run.stderr


def test_serve_refuses_bad_graph_flags_in_one_line(char_model_dir):
    """Graph settings are checked before any process starts: one line, exit 2,
    naming the flag."""
    cases = [(["--device", "cpu", "--cuda-graphs", "flat"], "needs a CUDA device"),
             (["--device", "cuda", "--graph-capacities", "512:32,oops"], "tokens:segments"),
             (["--device", "cuda", "--graph-capacities", "512:0"], "tokens:segments"),
             (["--device", "cpu", "--graph-capacities", "512:32"], "only applies with flat CUDA graphs"),
             (["--device", "cuda", "--cuda-graphs", "off", "--graph-capacities", "512:32"], "--cuda-graphs off")]
    for i, (extra, message) in enumerate(cases):  # the first as a user runs it, the others in process
        run = (flide if i == 0 else lambda *a: main_in_process(flide_main, *a))(
            "serve", "--model-path", str(char_model_dir), "--port", "0", *extra)
        assert run.returncode == 2 and run.stderr.count("\n") == 1 and message in run.stderr, run.stderr


def test_serve_refuses_bad_log_levels_in_one_line(char_model_dir):
    for flag, value in (("--log-level", "loud"), ("--log-level-http", "verbose")):
        run = main_in_process(flide_main, "serve", "--model-path", str(char_model_dir), "--port", "0", flag, value)
        assert run.returncode == 2 and run.stderr.count("\n") == 1 and f"{flag} '{value}'" in run.stderr, run.stderr


def test_serve_refuses_bad_body_limits_in_one_line(char_model_dir):
    """--max-body-mb and --body-read-timeout are checked before any process starts."""
    for flag, value, message in (("--max-body-mb", "0", "must be a positive number"),
                                 ("--max-body-mb", "lots", "is not a number"),
                                 ("--body-read-timeout", "-1", "must be a positive number"),
                                 ("--body-read-timeout", "inf", "must be a positive number")):
        run = main_in_process(flide_main, "serve", "--model-path", str(char_model_dir), "--port", "0", flag, value)
        assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
        assert flag in run.stderr and message in run.stderr, run.stderr


def test_serve_refuses_an_unknown_residual_dtype_in_one_line(char_model_dir):
    run = main_in_process(flide_main, "serve", "--model-path", str(char_model_dir), "--port", "0",
                          "--residual-dtype", "bfloat16")
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "--residual-dtype must be one of float32, model, not 'bfloat16'" in run.stderr, run.stderr


def test_serve_refuses_a_port_uvicorn_would_wrap_in_one_line(char_model_dir):
    for port in ("99999", "-1"):
        run = main_in_process(flide_main, "serve", "--model-path", str(char_model_dir), "--port", port)
        assert run.returncode == 2 and run.stderr.count("\n") == 1 and "--port must be an integer in [0, 65535]" in \
            run.stderr, run.stderr


def test_serve_refuses_a_taken_port_before_it_loads_the_model(tmp_path):
    """The port is taken before anything loads: a model path that does not
    exist is not even looked at."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        run = main_in_process(flide_main, "serve", "--model-path", str(tmp_path / "absent"), "--port", port)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert f"cannot listen on 127.0.0.1:{port} (--host, --port): Address already in use" in run.stderr


def test_serve_refuses_bad_liveness_flags_in_one_line(char_model_dir):
    cases = [("--watchdog-timeout", "0"), ("--heartbeat-timeout", "-1"), ("--request-timeout", "nan"),
             ("--max-queued-requests", "0"), ("--round-seconds", "0"), ("--round-seconds", "inf"),
             ("--watchdog-timeout", "1e999")]
    for flag, value in cases:
        run = main_in_process(flide_main, "serve", "--model-path", str(char_model_dir), "--port", "0", flag, value)
        assert run.returncode == 2 and run.stderr.count("\n") == 1 and f"{flag} must be a positive" in run.stderr, \
            run.stderr


def test_a_flag_argparse_cannot_parse_is_one_line():
    """argparse's usage block is not printed before a parse error: the error
    alone, one line, exit 2, for the top-level parser and each subcommand's."""
    cases = ((["serve", "--model-path", "m", "--tp", "2"], "flide: error: unrecognized arguments: --tp 2"),
             (["serve", "--model-path", "m", "--port", "y"], "flide serve: error: argument --port: invalid int value"),
             (["decide", "--model", "m"], "flide decide: error: the following arguments are required: --input"),
             ([], "flide: error: the following arguments are required: command"))
    for i, (args, start) in enumerate(cases):  # the first as a user runs it, the others in process
        run = (flide if i == 0 else lambda *a: main_in_process(flide_main, *a))(*args)
        assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
        assert run.stderr.startswith(start) and run.stderr.endswith("(--help lists the flags)\n"), run.stderr
    assert "usage: flide serve" in flide("serve", "--help").stdout  # --help still prints the usage
