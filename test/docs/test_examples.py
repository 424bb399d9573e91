"""Every curl and Python example of README.md and docs/*.md, run as written against a
live CPU server: ``flide serve --model-path smollm2-135m``, the server the examples name
(their port, 30000, becomes a free one). A curl example must answer without SGLang's
error object, except under a page's *Errors* heading, where it must answer one; a Python
example must exit 0."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from test.helpers import ROOT
from test.helpers.processes import quiet_env, serving

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PORT = "30000"


def fenced(path, language: str) -> list:
    """``(line, heading, text)`` of every fenced ``language`` block of ``path``:
    its first line's number and the ``##`` heading it sits under."""
    out, heading, block, start = [], "", None, 0
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if block is None:
            if line.startswith("## "):
                heading = line[3:].strip()
            elif line.strip() == f"```{language}":
                block, start = [], n + 1
        elif line.strip() == "```":
            out.append((start, heading, "\n".join(block)))
            block = None
        else:
            block.append(line)
    return out


def curl_commands(text: str) -> list:
    """The ``curl`` commands of a shell block, each with its continuation lines
    (a trailing backslash, or a single-quoted string still open)."""
    commands, current = [], None
    for line in text.splitlines():
        if current is None:
            if not line.startswith("curl "):
                continue
            current = line
        else:
            current += "\n" + line
        if current.count("'") % 2 == 0 and not current.endswith("\\"):
            commands.append(current)
            current = None
    return commands


def examples(kind: str) -> list:
    out = []
    for page in PAGES:
        for line, heading, text in fenced(page, "bash" if kind == "curl" else "python"):
            for command in curl_commands(text) if kind == "curl" else [text]:
                out.append(pytest.param(heading, command, id=f"{page.name}:{line}"))
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serving([sys.executable, "-m", "flide_ext.entrypoints.cli", "serve", "--model-path", "smollm2-135m"],
                       tmp_path_factory.mktemp("examples_server"))


def on(server: str, text: str) -> str:
    port = server.rsplit(":", 1)[1]
    return re.sub(rf"(localhost|127\.0\.0\.1):{PORT}\b", rf"\g<1>:{port}", text)


def test_the_pages_have_examples():
    curls, pythons = examples("curl"), examples("python")
    assert len(curls) >= 10 and len(pythons) >= 5
    # The shapes the extractor must keep whole: a JSON body over several lines.
    assert any(command.values[1].count("\n") >= 3 for command in curls)


@pytest.mark.parametrize("heading,command", examples("curl"))
def test_curl_example(server, heading, command):
    run = subprocess.run(["bash", "-c", "set -o pipefail; " + on(server, command)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and run.stdout.strip(), run.stderr
    try:
        body = json.loads(run.stdout)
    except json.JSONDecodeError:
        body = None  # text answers: /flush_cache's, /metrics'
    failed = isinstance(body, dict) and body.get("object") == "error"
    assert failed == (heading == "Errors"), run.stdout


@pytest.mark.parametrize("heading,code", examples("python"))
def test_python_example(server, heading, code):
    run = subprocess.run([sys.executable, "-c", on(server, code)], capture_output=True, text=True, timeout=600,
                         env=quiet_env(), cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip()
