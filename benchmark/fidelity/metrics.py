"""Label distributions and their distance to a float32 reference.

A question's answer is its label log-probabilities (``[L]`` floats); its
distribution is their softmax over the labels (SGLang's ``apply_softmax``). The
total variation (TV) distance of two distributions p, q is ``0.5 * sum |p - q|``
(Levin, Peres & Wilmer, "Markov Chains and Mixing Times", 2nd ed., sec. 4.1).
"""

from __future__ import annotations

import numpy as np


def label_distribution(label_logprobs) -> np.ndarray:
    """``[L]`` float64 softmax of one question's label log-probabilities (or of an
    already normalised distribution's logs: it is invariant to a shift)."""
    x = np.asarray(label_logprobs, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def tv_distance(p: np.ndarray, q: np.ndarray) -> float:
    """TV distance of two distributions over the same labels (in [0, 1])."""
    return float(0.5 * np.abs(np.asarray(p, np.float64) - np.asarray(q, np.float64)).sum())


def compare(answers: list, reference: list) -> dict:
    """Per question TV to the reference, argmax agreement and the squared error of
    the label log-probabilities (``sum_l (log p_l - log q_l)^2``; independent
    errors add in it, which TV's absolute values do not).

    Args:
        answers, reference: per question its label distribution (``[L]`` arrays).

    Returns:
        ``{"tv": [Q] floats, "argmax_equal": [Q] bools, "sq_error": [Q] floats}``.

    Raises:
        ValueError: the lists differ in length or a question's label counts differ.
    """
    if len(answers) != len(reference):
        raise ValueError(f"{len(answers)} answers for {len(reference)} reference questions")
    tv, equal, sq = [], [], []
    for a, r in zip(answers, reference):
        if len(a) != len(r):
            raise ValueError(f"an answer over {len(a)} labels against a reference over {len(r)}")
        tv.append(tv_distance(a, r))
        equal.append(bool(np.argmax(a) == np.argmax(r)))
        d = np.log(np.maximum(a, 1e-300)) - np.log(np.maximum(r, 1e-300))
        sq.append(float(((d - d.mean()) ** 2).sum()))
    return {"tv": tv, "argmax_equal": equal, "sq_error": sq}


def summarize(tv: list, argmax_equal: list) -> dict:
    """Mean, p99 and max TV, and argmax agreement (count and fraction), of one
    engine on one question set."""
    t = np.asarray(tv, dtype=np.float64)
    agree = int(sum(argmax_equal))
    return {"questions": len(tv), "mean_tv": float(t.mean()), "p99_tv": float(np.percentile(t, 99)),
            "max_tv": float(t.max()), "argmax_agree": agree, "argmax_agree_frac": agree / len(tv)}


def head_to_head(tv_a: list, tv_b: list) -> dict:
    """Per question, how often engine A is at least as close to float32 as engine B
    (``a_closer_or_equal``), and strictly closer (``a_closer``), as fractions."""
    a, b = np.asarray(tv_a), np.asarray(tv_b)
    return {"a_closer_or_equal": float((a <= b).mean()), "a_closer": float((a < b).mean())}
