"""An SGLang frontend program that asks several questions of one state with
``sgl.decide``, answered by a Flide server.

    .venv/bin/flide serve --model-path smollm2-135m --port 30000 &
    .venv/bin/python examples/sgl_decide.py --url http://127.0.0.1:30000
"""

import argparse

import sglang as sgl

import flide_ext  # noqa: F401  (registers sgl.decide)
from flide_ext.entrypoints.lang import FlideEndpoint


@sgl.function
def triage(s, ticket):
    s += "Support ticket:\n" + ticket + "\n"
    s += sgl.decide(
        "triage",
        questions=[
            {"id": "category", "type": "choice", "question": "What is the ticket about?",
             "options": [{"name": "Billing"}, {"name": "Shipping"}, {"name": "Login"}]},
            {"id": "refund", "type": "choice", "question": "Does the customer ask for money back?",
             "options": [{"name": "Yes"}, {"name": "No"}]},
            {"id": "urgency", "type": "score", "question": "How urgent is it?", "levels": ["low", "medium", "high"]},
        ],
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--api-key")
    args = parser.parse_args()
    state = triage.run(
        ticket="I was charged twice for order #4471 yesterday. Please refund the duplicate charge.",
        backend=FlideEndpoint(args.url, api_key=args.api_key),
    )
    if state.error() is not None:
        raise SystemExit(f"sgl_decide: {state.error()}")
    for qid in ("category", "refund", "urgency"):
        answer = state.get_meta_info("triage")["answers"][qid]
        print(f"{qid}: {state[qid]}  {answer['probabilities']}")


if __name__ == "__main__":
    main()
