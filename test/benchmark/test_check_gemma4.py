"""benchmark/kernels/check_gemma4.py's inputs on CPU (the checks themselves need a
GPU: under the Triton interpreter its bf16 dot products are not a GPU's): the
tiny Gemma 4 it checks builds in Flide with every text feature and two
ForkAttention block sizes in bf16, and a prompt's stream rows are its path's."""

from __future__ import annotations

import sys

import torch

from test.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmark" / "kernels"))


def test_tiny_gemma4_has_every_feature_and_two_block_sizes():
    from check_gemma4 import tiny_gemma4_config

    from flide_ext.assets.random_checkpoints import random_model
    from flide_ext.runtime.graph_runner import TableSpec

    config = tiny_gemma4_config()
    model = random_model(config, torch.bfloat16, "cpu")
    assert len(TableSpec.of(model, torch.bfloat16).block_sizes) == 2
    assert config.hidden_size_per_layer_input and config.num_kv_shared_layers and config.attention_k_eq_v
    assert config.final_logit_softcapping and config.sliding_window < 375  # RACE-shaped states cross it


def test_rows_of_a_prompt_are_its_path():
    from check_gemma4 import _rows_of

    from flide_ext.plan.flat import plan_round

    prompts = [[1, 2, 3, 4], [1, 2, 3, 5, 6], [7, 8]]
    plan = plan_round([0, 0, 1], prompts, "cpu")
    for i, prompt in enumerate(prompts):
        rows = _rows_of(plan, i, "cpu")
        assert plan.token_ids[rows].tolist() == prompt
        assert plan.positions[rows].tolist() == list(range(len(prompt)))
