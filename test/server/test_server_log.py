"""The server's log as SGLang's reads: a ready line naming where it listens and
what it holds, then the rounds' stats every --decode-log-interval rounds."""

from __future__ import annotations

import re
import sys
import time

import requests

from test.helpers.processes import start_server

STATS = re.compile(r"Decision stats\. #round: (\d+) \(eager: (\d+)\), #req: (\d+), #question: (\d+), "
                   r"#stream-token: (\d+), #saved-token: (-?\d+), #cached-token: (\d+), round: [\d.]+ ms mean, "
                   r"[\d.]+ ms max, question/s: [\d.]+, #queue-req: (\d+)")


def test_ready_line_then_round_stats_every_interval(char_model_dir, tmp_path):
    proc, url, log = start_server([sys.executable, "-m", "flide_ext.entrypoints.cli", "serve", "--model-path",
                                   str(char_model_dir), "--context-length", "400", "--decode-log-interval", "2",
                                   "--log-level-http", "warning"], tmp_path)
    try:
        text = log.read_text()
        ready = re.search(r"Decision server ready at (\S+)\. model: (\S+), dtype: float32, graphs: 0 captured in "
                          r"0\.0 s, memory: weights ([\d.]+) MB, states ([\d.]+) [MG]B, cache ([\d.]+) MB, "
                          r"load: [\d.]+ s, warm-up: none, start-up: ([\d.]+) s", text)
        assert ready is not None, text
        assert ready[1] == url and ready[2] == str(char_model_dir)
        assert float(ready[3]) > 0 and float(ready[5]) > 0 and float(ready[6]) > 0
        before = len(STATS.findall(text))
        # Four requests of three questions sharing a 150-token state, one round each.
        query = [3 + i % 90 for i in range(150)]
        for i in range(4):
            body = {"query": query, "items": [[40 + i, 7], [50 + i], [60 + i, 8, 9]], "label_token_ids": [1, 2]}
            assert requests.post(f"{url}/v1/score", json=body, timeout=60).status_code == 200
        deadline = time.time() + 30
        while len(lines := STATS.findall(log.read_text())) < before + 2 and time.time() < deadline:
            time.sleep(0.05)
        assert len(lines) >= before + 2, log.read_text()
        assert all(int(line[0]) in (1, 2) for line in lines)  # the first round alone, then every 2
        ours = lines[-2:]
        assert sum(int(line[3]) for line in ours) >= 6  # questions of the requests just sent among them
        # Later requests resume the shared query from the state cache: tokens saved, cached.
        assert int(ours[-1][5]) > 0 and int(ours[-1][6]) > 0
    finally:
        proc.terminate()
        proc.wait(30)
