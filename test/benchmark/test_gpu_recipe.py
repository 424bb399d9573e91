"""scripts/fetch_server_wheels.sh (the wheels the lent H200 lacks) against what runs
there: every distribution that Flide's server (`python -m sglang.launch_server
--decision-mode`, all its processes, answering requests) and SGLang's bench_serving
(benchmark/bench_serving_sglang.py) import on CPU is fetched by the script or named in
its ON_IMAGE list."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import time

import requests
from packaging.utils import canonicalize_name

from test.helpers import ROOT
from test.helpers.processes import quiet_env, start_server

SCRIPT = ROOT / "scripts" / "fetch_server_wheels.sh"

# Loaded by every Python process started with this folder on PYTHONPATH: writes the
# top-level names of the modules it has imported to DIR/PID.txt twice a second (a
# server stopped by a signal runs no exit hooks).
IMPORT_LOG = '''
import os, sys, threading, time

def _log():
    path = os.path.join(os.environ["FLIDE_IMPORT_LOG"], f"{os.getpid()}.txt")
    while True:
        with open(path + ".part", "w") as f:
            f.write("\\n".join(sorted({name.split(".")[0] for name in list(sys.modules)})) + "\\n")
        os.replace(path + ".part", path)
        time.sleep(0.5)

threading.Thread(target=_log, daemon=True).start()
'''


def recipe() -> tuple[set, set]:
    """The script's fetched distributions (its ``NAME==VERSION`` pins) and ON_IMAGE list."""
    text = SCRIPT.read_text()
    fetched = {canonicalize_name(pin.split("==")[0]) for pin in re.findall(r"\b([\w.-]+)==[\w.]+", text)}
    on_image = re.search(r"^ON_IMAGE=\(([^)]*)\)", text, re.M).group(1).split()
    return fetched, {canonicalize_name(name) for name in on_image}


def distributions(module_names: set) -> set:
    """Installed distributions providing these top-level modules (stdlib and the
    interpreter's own modules provide none)."""
    provides = importlib.metadata.packages_distributions()
    return {canonicalize_name(d) for name in module_names for d in provides.get(name, [])}


def test_recipe_covers_what_the_server_imports(char_model_dir, tmp_path):
    hook, log = tmp_path / "hook", tmp_path / "imports"
    hook.mkdir(), log.mkdir()
    (hook / "sitecustomize.py").write_text(IMPORT_LOG)
    env = {"PYTHONPATH": str(hook), "FLIDE_IMPORT_LOG": str(log)}
    proc, url, _ = start_server([sys.executable, "-m", "sglang.launch_server", "--decision-mode", "--model-path",
                                 str(char_model_dir), "--context-length", "400"], tmp_path, extra_env=env,
                                cwd=tmp_path)
    try:
        score = requests.post(f"{url}/v1/score", json={"query": [5, 6, 7], "items": [[8], [9]],
                                                      "label_token_ids": [10, 11], "apply_softmax": True}, timeout=60)
        decision = requests.post(f"{url}/v1/decisions", json={"input": "a state", "questions": [
            {"id": "q", "type": "choice", "question": "Which?", "options": [{"name": "a"}, {"name": "b"}]}]},
            timeout=60)
        assert score.status_code == 200 and decision.status_code == 200, (score.text, decision.text)
        bench = subprocess.run([sys.executable, str(ROOT / "benchmark" / "bench_serving_sglang.py"), "--base-url", url,
                                "--model", str(char_model_dir), "--backend", "decision-score", "--dataset-name", "race",
                                "--num-prompts", "2", "--decision-scale", "0.1", "--disable-tqdm",
                                "--output-file", str(tmp_path / "race.jsonl")],
                               env={**quiet_env(), **env}, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert bench.returncode == 0, bench.stderr[-2000:]
        time.sleep(1.5)  # every process's log written after the requests
    finally:
        proc.terminate()
        proc.wait(30)
    logs = list(log.glob("*.txt"))
    assert len(logs) >= 3  # the HTTP server, its scheduler, the benchmark
    imported = distributions({name for path in logs for name in path.read_text().split()})
    assert {"torch", "sglang", "fastapi", "datasets"} <= imported
    fetched, on_image = recipe()
    assert imported - fetched - on_image - {"flide"} == set()


def test_run_h200_accepts_every_step_it_defines():
    """benchmark/serving/run_h200.sh: each ``step_NAME`` function is a step its
    argument parser accepts, and each accepted step has its function (a step
    missing from the parser is refused as an unknown argument on the GPU)."""
    text = (ROOT / "benchmark" / "serving" / "run_h200.sh").read_text()
    defined = set(re.findall(r"^step_(\w+)\(\)", text, re.M))
    accepted = set(re.search(r"^\s+((?:\w+\|)+\w+)\)\n\s+STEPS\+=", text, re.M).group(1).split("|"))
    assert defined and defined == accepted, (defined - accepted, accepted - defined)
