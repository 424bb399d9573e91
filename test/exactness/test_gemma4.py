"""Gemma 4 (flide_ext/models/gemma4.py) on the CPU in float32: every question
of a multi-request round equals its prompt alone and a float32 transformers
forward, for a dense config, one with per-layer embeddings, KV sharing, K = V
on full layers and soft-capping, and one that adds experts; states on both sides
of the sliding window; from the state cache and without it; and the text part
of a multimodal checkpoint."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from flide_ext import Engine
from flide_ext.models.gemma4 import kv_sources
from test.helpers.checkpoints import tiny_config, write_tiny_checkpoint
from test.helpers.exact_checks import VOCAB, assert_exact, make_request

FAMILIES = ["gemma4_dense", "gemma4", "gemma4_moe"]


def _hf(directory):
    from transformers import AutoModelForCausalLM

    # Eager attention and experts: the checkpoint's plain float32 forward.
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager")
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    return model.eval()


@pytest.fixture(scope="module")
def gemma_dirs(tmp_path_factory):
    """(family, window) -> checkpoint: a window of 8 tokens (every state crosses
    it) and Gemma 4's own 512."""
    root = tmp_path_factory.mktemp("gemma4")
    return {(family, window): write_tiny_checkpoint(root / f"{family}_{window}", family, seed=i, sliding_window=window)
            for i, family in enumerate(FAMILIES) for window in (8, 512)}


@pytest.fixture(scope="module")
def gemma_models(gemma_dirs):
    return {key: (Engine(str(d)), _hf(d)) for key, d in gemma_dirs.items()}


def _labels(request):
    labels = request["label_token_ids"]
    return labels if isinstance(labels[0], list) else [labels] * len(request["prompts"])


def test_kv_sources_of_the_configs():
    config = tiny_config("gemma4")  # layers S S F | S S F, the last three shared
    assert kv_sources(config) == [0, 1, 2, 1, 1, 2]
    assert kv_sources(tiny_config("gemma4_dense")) == list(range(6))
    with pytest.raises(ValueError, match="no layer of its type"):
        kv_sources(tiny_config("gemma4", num_kv_shared_layers=4))  # layer 2 (full) is shared: no full layer before


@pytest.mark.parametrize("family", FAMILIES)
def test_multi_request_round(family, gemma_models):
    engine, hf = gemma_models[(family, 8)]
    rng = random.Random(5)
    requests = [make_request(rng, n, q) for n, q in [(20, 4), (3, 3), (40, 5), (1, 2)]]
    state = requests[2]["prompts"][0][:40]
    requests.append({"prompts": [state, state + [1], state + [1], state + [2]], "label_token_ids": [7, 8, 9]})
    stats = assert_exact(engine, hf, requests)
    assert stats.stream_tokens < stats.prompt_tokens
    # On the CPU in float32 a question's bits do not depend on its round.
    for request, answer in zip(requests, engine.score_tokens_batch(requests)):
        for prompt, labels, got in zip(request["prompts"], _labels(request), answer.label_logprobs):
            assert engine.score_tokens({"prompts": [prompt], "label_token_ids": [labels]}).label_logprobs[0] == got


@pytest.mark.parametrize("family", FAMILIES)
def test_without_the_state_cache(family, gemma_dirs, gemma_models):
    # No K/V pool: KV-shared layers read what their source left in the forward.
    engine = Engine(str(gemma_dirs[(family, 8)]), radix_cache=False)
    assert engine.runner.kv_pool is None
    rng = random.Random(6)
    assert_exact(engine, gemma_models[(family, 8)][1], [make_request(rng, n, q) for n, q in [(25, 4), (2, 2)]])


@pytest.mark.parametrize("family", ["gemma4_dense", "gemma4"])
def test_states_at_the_window(family, gemma_models):
    """States of 511, 512 and 513 tokens under a 512-token window: a question's
    window reaches into its state exactly as in its own prompt."""
    engine, hf = gemma_models[(family, 512)]
    rng = random.Random(512)
    history = [rng.randrange(VOCAB) for _ in range(513)]
    requests = []
    for n in (511, 512, 513):
        state = history[:n]
        firsts = rng.sample(range(VOCAB), 3)
        prompts = [state + [f] + [rng.randrange(VOCAB) for _ in range(k)] for f, k in zip(firsts, (0, 1, 3))]
        requests.append({"prompts": prompts, "label_token_ids": [3, 4, 5]})
    engine.flush_cache()
    assert_exact(engine, hf, requests)


@pytest.mark.parametrize("family", FAMILIES)
def test_resumed_state_equals_one_call(family, gemma_models):
    """A state kept in the state cache (K/V rows of the layers that own them;
    shared layers read their source's) gives the bits of one cold call."""
    engine, _ = gemma_models[(family, 8)]
    rng = random.Random(7)
    history = [rng.randrange(VOCAB) for _ in range(150)]
    prompts = [history + [f, rng.randrange(VOCAB)] for f in rng.sample(range(VOCAB), 3)]
    request = {"prompts": prompts, "label_token_ids": [5, 6, 7]}
    engine.flush_cache()
    cold = engine.score_tokens(request).label_logprobs
    engine.flush_cache()
    engine.score_tokens({"prompts": [history], "label_token_ids": [5, 6]})
    resumed = engine.score_tokens(request)
    assert resumed.resumed_tokens == 128
    assert resumed.label_logprobs == cold


def test_multimodal_checkpoint_text_part(gemma_dirs, tmp_path):
    """``Gemma4ForConditionalGeneration``'s text weights (``model.language_model.``)
    load and answer as the text checkpoint; its other towers are skipped."""
    from transformers import Gemma4Config

    text_dir = gemma_dirs[("gemma4", 8)]
    config = json.loads((text_dir / "config.json").read_text())
    full = Gemma4Config(text_config=config)
    full.architectures = ["Gemma4ForConditionalGeneration"]
    full.save_pretrained(tmp_path)
    weights = {"model.language_model." + k[len("model."):]: v for k, v in load_file(text_dir / "model.safetensors").items()}
    weights["model.vision_tower.patch_embedder.input_proj.weight"] = torch.zeros(4, 4)
    save_file(weights, tmp_path / "model.safetensors")
    rng = random.Random(8)
    request = make_request(rng, 30, 3)
    assert Engine(str(tmp_path)).score_tokens(request).label_logprobs == \
        Engine(str(text_dir)).score_tokens(request).label_logprobs


def test_round_tables_of_two_block_sizes_through_the_triton_kernels(gemma_dirs, monkeypatch):
    """The GPU path's kernels and round tables (Triton, interpreted), with tiles
    of 16 rows for the 16-wide sliding heads and 32 for the 32-wide full ones, so
    the round's tables hold two ForkAttention block sizes: a multi-request round
    crossing the window equals the reference path (1e-4), and padded to a larger
    capacity (a graph's tables) equals itself unpadded (1e-5)."""
    import flide_ext.kernels.fork_attention.kernel as fat
    from flide_ext.kernels.tables import TableCapacity
    from flide_ext.plan.flat import plan_round
    from flide_ext.runtime.graph_runner import TableSpec
    from flide_ext.runtime.round_buffers import device_round

    monkeypatch.setattr(fat, "_tile_config",
                        lambda D, dtype, group: (16, 16, 4, 1, False) if D <= 16 else (32, 32, 4, 1, False))
    model = Engine(str(gemma_dirs[("gemma4", 8)])).model
    spec = TableSpec.of(model, torch.float32)
    assert spec.block_sizes == (16, 32)
    rng = random.Random(5)
    state = [rng.randrange(3, VOCAB) for _ in range(40)]
    requests = [0, 0, 0, 1, 1]
    prompts = [state + [7], state + [8, 9, 10], state + [11] * 20, [5, 6, 7, 8], [5, 6, 7, 9, 9, 9]]
    plan = plan_round(requests, prompts, "cpu")
    R = int(plan.readout_rows.numel())

    def logprobs(p):
        with torch.inference_mode():
            return model(p, None)

    want = logprobs(plan)
    model.set_kernel_backend("triton")
    exact = logprobs(device_round(plan, spec, "cpu"))
    wide = logprobs(device_round(plan, spec, "cpu", TableCapacity(tokens=256, segments=12, levels=3), 12))
    torch.testing.assert_close(exact, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(wide[:R], exact, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(wide).all()


def test_moe_refused_on_a_gpu_dense_allowed(gemma_dirs):
    """The MoE variant is refused on a CUDA device in one line naming why (its
    experts are chosen on the host), loaded or handed to the engine built; the
    dense variants and the CPU pass the check."""
    from flide_ext.models import Gemma4ForCausalLM, Qwen3_5ForCausalLM
    from flide_ext.models.loader import check_gpu_support, load_model
    from flide_ext.protocol.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="'Gemma4ForCausalLM' runs on the CPU only so far: its MoE block"):
        load_model(gemma_dirs[("gemma4_moe", 8)], torch.float32, "cuda")
    moe, dense = tiny_config("gemma4_moe"), tiny_config("gemma4")
    with pytest.raises(ModelLoadError, match="CPU only so far"):
        check_gpu_support(Gemma4ForCausalLM, "Gemma4ForCausalLM", "cuda:0", moe)
    with pytest.raises(ModelLoadError, match="CPU only so far"):  # the text part of a multimodal config
        check_gpu_support(Gemma4ForCausalLM, "Gemma4ForConditionalGeneration", "cuda", SimpleNamespace(text_config=moe))
    check_gpu_support(Gemma4ForCausalLM, "Gemma4ForCausalLM", "cpu", moe)
    check_gpu_support(Gemma4ForCausalLM, "Gemma4ForCausalLM", "cuda", dense)
    check_gpu_support(Gemma4ForCausalLM, "Gemma4ForCausalLM", "cuda", tiny_config("gemma4_dense"))
    check_gpu_support(Qwen3_5ForCausalLM, "Qwen3_5ForCausalLM", "cuda", tiny_config("qwen3_5"))



def test_default_rope_ignores_a_partial_factor_as_gemma4_does(tmp_path):
    """Gemma 4's default rotary turns the whole head even when its layer type's
    parameters name a ``partial_rotary_factor`` (transformers' own Gemma 4 forward)."""
    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5},
            "full_attention": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}}
    directory = write_tiny_checkpoint(tmp_path / "rope", "gemma4", seed=4, sliding_window=8, rope_parameters=rope)
    engine = Engine(str(directory))
    assert {t: r.rotary_dim for t, r in engine.model.rotary.items()} == {"sliding_attention": 16, "full_attention": 32}
    assert_exact(engine, _hf(directory), [make_request(random.Random(4), 30, 3)])


def test_ids_past_a_short_per_layer_table_are_refused_alone(tmp_path):
    from flide_ext.protocol.errors import RequestError

    directory = write_tiny_checkpoint(tmp_path / "ple", "gemma4", seed=5, sliding_window=8,
                                      vocab_size_per_layer_input=256)
    engine = Engine(str(directory))
    assert engine.vocab_size == 256
    ok = {"prompts": [[1, 2, 3], [1, 2, 4]], "label_token_ids": [5, 6]}
    answers = engine.score_tokens_batch([ok, {"prompts": [[1, 2, 300]], "label_token_ids": [5, 6]}])
    assert answers[0].label_logprobs == engine.score_tokens(ok).label_logprobs
    assert isinstance(answers[1], RequestError) and "token id 300 is outside the vocabulary [0, 256)" in str(answers[1])
