"""Decision requests for tests: a choice question, and the bundled example requests."""

from __future__ import annotations

import json

from . import EXAMPLES

EXAMPLE_DECISIONS = EXAMPLES / "decisions.jsonl"
"""The bundled examples: one ``{"id", "request", "expected"}`` object a line."""


def choice(qid="q", n=3, question="Which one?"):
    return {"id": qid, "type": "choice", "question": question, "options": [{"name": f"opt{i}"} for i in range(n)]}


def example_requests():
    """The decision requests of the bundled examples, in file order."""
    return [json.loads(line)["request"] for line in EXAMPLE_DECISIONS.read_text().splitlines() if line.strip()]
