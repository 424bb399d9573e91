"""A request normalised over its labels (``over_labels``: SGLang's ``/v1/score``
with ``apply_softmax``) computes only its labels' logits: its answers are the
full-vocabulary answers renormalised over the labels, equal a float32
transformers forward's softmax over the labels, and are the same bits alone or
beside full-vocabulary requests in one round (and those are unchanged by it)."""

import math
import os

import pytest
import torch

from flide_ext.layers.readout import normalised_over_labels
from test.helpers.checkpoints import hf_label_logprobs


def _groups(seed: int):
    gen = torch.Generator().manual_seed(seed)
    state = torch.randint(3, 200, (40,), generator=gen).tolist()
    asking = ([state + [201], state + [202, 203], state + [204] * 5], [[1, 2, 3, 4], [5, 6], [7, 8, 9]])
    other = ([[7, 8, 9, 10, 11], [7, 8, 12]], [[1, 2], [3, 4, 5]])
    return asking, other


def test_normalised_over_labels_is_a_log_softmax_over_them():
    got = normalised_over_labels([2.0, -1.0, 0.5])
    want = torch.log_softmax(torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64), 0).tolist()
    assert got == pytest.approx(want, abs=1e-15)
    assert math.fsum(math.exp(x) for x in got) == pytest.approx(1.0, abs=1e-15)
    # A shift of every logit changes nothing; a -inf label keeps probability 0.
    assert normalised_over_labels([x + 1e3 for x in [2.0, -1.0, 0.5]]) == pytest.approx(got, abs=1e-12)
    assert normalised_over_labels([0.0, -math.inf]) == [0.0, -math.inf]


@pytest.mark.parametrize("family", ["qwen3_5", "llama"])
def test_label_answers_are_the_vocabularys_renormalised_and_the_float32_references(family, tiny_engines, tiny_hf):
    engine = tiny_engines[family]
    asking, other = _groups(1)
    full = engine.run_round([asking]).answers[0]
    own = engine.run_round([asking], over_labels=[True]).answers[0]
    for prompt, labels, f, o in zip(asking[0], asking[1], full, own):
        assert o == pytest.approx(normalised_over_labels(f), abs=1e-6)
        reference = normalised_over_labels(hf_label_logprobs(tiny_hf[family], prompt, labels))
        assert o == pytest.approx(reference, abs=1e-4)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_a_mixed_round_answers_each_request_as_alone(backend, tiny_dirs):
    from flide_ext import Engine

    if backend == "triton":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    engine = Engine(str(tiny_dirs["qwen3_5"]))
    engine.model.set_kernel_backend(backend)
    asking, other = _groups(2)
    alone_labels = engine.run_round([asking], over_labels=[True]).answers[0]
    alone_full = engine.run_round([other]).answers[0]
    mixed = engine.run_round([other, asking], over_labels=[False, True]).answers
    assert mixed[0] == alone_full
    assert mixed[1] == alone_labels
    # run_rounds passes each request's flag to its round.
    batched = engine.run_rounds([asking, other], over_labels=[True, False]).answers
    assert batched == [alone_labels, alone_full]


def test_without_selective_readout_the_answers_are_renormalised_too(tiny_engines):
    engine = tiny_engines["qwen3_5"]
    asking, _ = _groups(3)
    want = engine.run_round([asking], over_labels=[True]).answers[0]
    engine.model.selective_readout = False
    try:
        got = engine.run_round([asking], over_labels=[True]).answers[0]
    finally:
        engine.model.selective_readout = True
    for g, w in zip(got, want):
        assert g == pytest.approx(w, abs=1e-6)


def test_bad_flags_and_labels_are_refused_with_a_clear_error(tiny_engines):
    """Found by a breaker run: the kernels read label rows unchecked, so the readout
    checks every label id (both readouts); one flag per request; no labels, no answers."""
    engine = tiny_engines["qwen3_5"]
    state = [5, 6, 7, 8]
    for labels in ([[512]], [[-1, 3]], [[100000]]):
        for over in ([True], [False]):
            with pytest.raises(ValueError, match=r"label token ids must be integers in \[0, 512\)"):
                engine.run_round([([state], labels)], over_labels=over)
    group = ([state], [[1, 2]])
    for flags in ([True], [], [True, False, True]):
        with pytest.raises(ValueError, match="over_labels has"):
            engine.run_round([group, group], over_labels=flags)
        with pytest.raises(ValueError, match="over_labels has"):
            engine.run_rounds([group, group], over_labels=flags)
    # A numpy array of flags works as a list does, in both forms.
    import numpy as np

    flags = np.array([True, False])
    assert engine.run_rounds([group, group], over_labels=flags).answers == \
        engine.run_round([group, group], over_labels=[True, False]).answers
    assert engine.run_round([([state + [50]], [[]])], over_labels=[True]).answers == [[[]]]
    # The engine still answers afterwards.
    assert len(engine.run_round([group], over_labels=[True]).answers[0][0]) == 2
