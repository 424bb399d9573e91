"""benchmark/check_invariance.py on CPU: a bf16 hybrid model's probe questions
give the same bits in rounds of other requests and resumed from their own
checkpoints as alone and cold."""

from __future__ import annotations

import json
import sys

from test.helpers import ROOT
from test.helpers.processes import main_in_process

sys.path.insert(0, str(ROOT / "benchmark"))

import check_invariance  # noqa: E402


def test_every_condition_is_bitwise_equal_on_cpu(tmp_path):
    out = tmp_path / "inv.json"
    run = main_in_process(check_invariance.main, "--model", "tiny-qwen3.5", "--device", "cpu", "--probes", "3",
                          "--others", "1", "3", "--scale", "0.1", "--strict", "--state-cache-gb", "0.125",
                          "--out", str(out))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(out.read_text())
    conditions = {c["condition"]: c for c in result["conditions"]}
    assert list(conditions) == ["with 1 others, eager", "with 3 others, eager", "resumed", "resumed with 8 others"]
    assert all(c["questions"] == 54 and c["bitwise_equal"] == 54 for c in conditions.values())
    assert conditions["resumed"]["resumed_tokens"] > 0  # the probes did resume from checkpoints
    assert result["bitwise_equal"] == result["questions"] == 216 and result["settings"]["graphs"] == 0
    assert result["settings"]["state_cache_bytes"] == 2**27  # --state-cache-gb 0.125 reached the engine


def test_bad_arguments(tmp_path):
    for extra in (["--probes", "0"], ["--others", "0"], ["--scale", "0"], ["--model", "gpt-5"],
                  ["--device", "mps"], ["--device", "cpux"], ["--out", "/dev/null/x.json"], ["--out", str(tmp_path)],
                  ["--head-scale", "-1"], ["--head-scale", "nan"], ["--state-cache-gb", "0"],
                  ["--state-cache-gb", "many"]):
        run = main_in_process(check_invariance.main, "--device", "cpu", *extra)
        assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, (extra, run.stderr)
