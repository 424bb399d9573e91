"""``sgl.decide`` for SGLang's frontend language.

Inside an ``@sgl.function``, ``s += sgl.decide("name", questions=[...])`` asks
several questions of the program's current text (the state) in one call to a
Flide server's ``/v1/decisions``. Each question's answer lands in the program
state: ``state[question_id]`` is the chosen option (choice), ``"yes"``/``"no"``
(yes_no) or the expected level (score), and ``state.get_meta_info(name)``
holds every answer with its probabilities. Nothing is appended to the text.

Run such programs on :class:`FlideEndpoint` (a ``RuntimeEndpoint`` that knows
the ``decide`` primitive). Importing this module (or ``flide_ext`` after ``sglang``) registers
``sgl.decide``.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional

import requests
from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint
from sglang.lang.choices import ChoicesDecision
from sglang.lang.ir import SglSelect


class DecisionCall(list):
    """Stands in for a select's choice list: carries the decide call's questions
    to the backend through SGLang's own select dispatch."""

    def __init__(self, questions: List[Dict[str, Any]], temperature: float):
        super().__init__()
        self.questions = questions
        self.temperature = temperature


class SglDecide(SglSelect):
    """The ``decide`` primitive: an SglSelect whose choices are a DecisionCall."""

    def __init__(self, name: str, questions: List[Dict[str, Any]], temperature: float = 1.0):
        super().__init__(name, DecisionCall(questions, temperature), temperature, None)

    def __repr__(self):
        return f"Decide({self.name}, questions={[q.get('id') for q in self.choices.questions]})"


def decide(name: Optional[str] = None, questions: Optional[List[Dict[str, Any]]] = None, temperature: float = 1.0):
    """Ask ``questions`` (SGLang ``/v1/decisions`` question objects) of the current text.

    Raises:
        ValueError: no questions.
    """
    if not questions:
        raise ValueError("sgl.decide needs at least one question")
    return SglDecide(name or "decide", list(questions), temperature)


def _value(answer: Dict[str, Any]):
    if answer["type"] == "choice":
        return answer["choice"]
    if answer["type"] == "score":
        return answer["score"]
    probabilities = answer["probabilities"]
    return max(probabilities, key=probabilities.get)


class FlideEndpoint(RuntimeEndpoint):
    """A ``RuntimeEndpoint`` for a Flide server: ``sgl.decide`` goes to
    ``/v1/decisions``; everything else is SGLang's RuntimeEndpoint.

    Raises (from ``decide``): RuntimeError with the server's error message for a
    refused request (HTTP 4xx/5xx).
    """

    def select(self, s, choices, temperature, choices_method):
        if not isinstance(choices, DecisionCall):
            return super().select(s, choices, temperature, choices_method)
        body = {"input": s.text_ or " ", "questions": choices.questions, "temperature": choices.temperature}
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        response = requests.post(self.base_url + "/v1/decisions", json=body, headers=headers, timeout=600)
        if response.status_code != 200:
            error = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
            raise RuntimeError(f"/v1/decisions refused the call: {error.get('param')}: {error.get('message', response.text)}")
        answers = response.json()["answers"]
        for qid, answer in answers.items():
            s.variables[qid] = _value(answer)
            s.meta_info[qid] = answer
            # Question ids are not declared names of the program; give them a set event.
            s.variable_event.setdefault(qid, threading.Event()).set()
        return ChoicesDecision(decision="", meta_info={"answers": answers})


def register() -> None:
    """Make ``sgl.decide`` available (idempotent)."""
    import sglang

    sglang.decide = decide


register()  # importing this module (FlideEndpoint) makes sgl.decide available
