"""Gemma 4's GPU path on a CUDA device: check_kernels.py's checks at Gemma 4's shapes.

Each check prints one line and lands in a JSON file:

* ForkAttention at Gemma 4's heads (sliding layers' 256 with the 512-token
  window, full layers' 512, and 31B's full layers: K = V with one K/V head per 8
  query heads) in bf16 and float32 against its reference (float64 accumulation);
* ForkAttention alone == forked bitwise in bf16 at those heads, states crossing
  the window (QuALITY-shaped: 5,000 tokens);
* the RMSNorm's ``scale`` mode (Gemma4RMSNorm's rounding) at E4B's widths;
* whole forwards on the GPU in bf16 against the CPU float32 reference (TV
  distance of the next-token distributions, beside the same bf16 forward with
  the reference kernels): a tiny Gemma 4 with per-layer embeddings, KV sharing,
  K = V, soft-capping and two ForkAttention block sizes, and the E4B shape.

Usage::

    python benchmark/kernels/check_gemma4.py --out check_gemma4.json [--skip-e4b]

Exit status 1 when a check fails; 2 with one line without CUDA.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import check_kernels as ck  # noqa: E402
from check_kernels import BF16_TOL, FP32_TOL, check_model, plan_args, record, rel_err, run_steps  # noqa: E402
from workloads import attention_inputs, workload_prompts  # noqa: E402

from flide_ext.kernels.fork_attention import fork_attention_ref  # noqa: E402
from flide_ext.kernels.fork_attention.kernel import fork_attention_triton  # noqa: E402
from flide_ext.plan.flat import plan_round  # noqa: E402

# (query heads, K/V heads, head size, window): E4B's sliding and full layers, 31B's full layers.
HEADS = [(8, 2, 256, 512), (8, 2, 512, None), (32, 4, 512, None)]


def tiny_gemma4_config():
    """A small Gemma 4 with every text feature of the published checkpoints and
    the real head sizes (256 sliding, 512 full: two ForkAttention block sizes in
    bf16), a 64-token window so short states cross it."""
    from transformers import Gemma4TextConfig

    config = Gemma4TextConfig(
        vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=256, global_head_dim=512, sliding_window=64,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
        hidden_size_per_layer_input=32, vocab_size_per_layer_input=1024, num_kv_shared_layers=2,
        use_double_wide_mlp=True, attention_k_eq_v=True, num_global_key_value_heads=1,
        final_logit_softcapping=30.0, tie_word_embeddings=True, max_position_embeddings=8192)
    config.architectures = ["Gemma4ForCausalLM"]
    return config


def check_attention(gen):
    owners, prompts = workload_prompts("quality", requests=1)
    plan = plan_round(owners, prompts, ck.DEV)
    for Hq, Hkv, D, window in HEADS:
        for dtype in (torch.bfloat16, torch.float32):
            q, k, v = attention_inputs(plan.num_tokens, Hq, Hkv, D, gen, dtype)
            args = (*plan_args(plan), 1.0, window)  # Gemma 4 scales its queries by 1
            got = fork_attention_triton(q, k, v, *args)
            want = fork_attention_ref(q.float(), k.float(), v.float(), *args)
            tol = BF16_TOL if dtype == torch.bfloat16 else FP32_TOL
            err = rel_err(got, want)
            record(f"fork_attention {str(dtype)[6:]} Hq={Hq} Hkv={Hkv} D={D} window={window} (QuALITY-shaped)",
                   err, tol, err <= tol)


def check_alone_equals_forked(gen):
    for workload in ("race", "quality"):
        for Hq, Hkv, D, window in HEADS:
            owners, prompts = workload_prompts(workload, requests=2, seed=11)
            forked = plan_round(owners, prompts, ck.DEV)
            q, k, v = attention_inputs(forked.num_tokens, Hq, Hkv, D, gen, torch.bfloat16)
            out = fork_attention_triton(q, k, v, *plan_args(forked), 1.0, window)
            mismatched, picks = 0, [i for i in range(len(prompts)) if owners[i] == 1][:4]
            for i in picks:  # each prompt alone, its rows' q/k/v taken from the forked stream
                alone = plan_round([0], [prompts[i]], ck.DEV)
                index = _rows_of(forked, i, ck.DEV)
                got = fork_attention_triton(q[index], k[index], v[index], *plan_args(alone), 1.0, window)
                mismatched += int(not torch.equal(got, out[index]))
            record(f"alone == forked bitwise, bf16 {workload} Hq={Hq} D={D} window={window}",
                   f"{len(picks) - mismatched}/{len(picks)} equal", "all", mismatched == 0)


def _rows_of(plan, prompt: int, device) -> torch.Tensor:
    """Stream rows of ``prompt``'s path (root segment to its leaf), in order."""
    end = int(plan.readout_rows[plan.prompt_readout[prompt]]) + 1
    seg = int(plan.token_segment[end - 1])
    path = []
    while seg >= 0:
        path.append(seg)
        seg = int(plan.seg_parent[seg])
    rows = [torch.arange(int(plan.seg_start[s]), int(plan.seg_start[s]) + int(plan.seg_len[s]), device=device)
            for s in reversed(path)]
    return torch.cat(rows)


def check_scale_norm(gen):
    from flide_ext.kernels.rms_norm import rms_norm_ref
    from flide_ext.kernels.rms_norm.kernel import rms_norm_triton

    T, bf16 = 735, torch.bfloat16
    for label, shape in (("hidden", (T, 2560)), ("q/k head, sliding", (T, 8, 256)), ("k head, full", (T, 2, 512))):
        x = (2 * torch.randn(*shape, generator=gen, device=ck.DEV)).to(bf16)
        w = (0.1 * torch.randn(shape[-1], generator=gen, device=ck.DEV) + 1).to(bf16)
        got, want = rms_norm_triton(x, w, 1e-6, "scale").float(), rms_norm_ref(x, w, 1e-6, "scale").float()
        worst = float(((got - want).abs() / want.abs().clamp(min=2 ** -10)).max())
        record(f"rms_norm scale {label} {list(shape)}, Triton vs reference (bf16): max relative difference", worst,
               2 ** -6, worst <= 2 ** -6 and not got.isnan().any(), differing=float((got != want).double().mean()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="check_gemma4.json")
    parser.add_argument("--skip-e4b", action="store_true", help="skip the E4B-shaped whole-model check")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu under TRITON_INTERPRET=1 (smoke test)")
    args = parser.parse_args()
    ck.DEV = args.device
    if ck.DEV == "cuda" and not torch.cuda.is_available():
        print("check_gemma4.py: needs a CUDA GPU (torch sees none); --device cpu runs the kernels interpreted "
              "(set TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    gen = torch.Generator(device=ck.DEV).manual_seed(0)
    steps = [("attention", lambda: check_attention(gen)), ("alone == forked", lambda: check_alone_equals_forked(gen)),
             ("scale norm", lambda: check_scale_norm(gen)),
             ("tiny model", lambda: check_model("tiny Gemma 4", tiny_gemma4_config(),
                                                *workload_prompts("race", 2, vocab=1024)))]
    if not args.skip_e4b:
        from flide_ext.assets.random_checkpoints import shape_config

        owners, prompts = workload_prompts("race", 1, vocab=248320)
        prompts = [p[:160] + p[375:391] for p in prompts]  # 160-token state, 16-token questions: CPU time
        steps.append(("E4B model", lambda: check_model("Gemma-4-E4B-shaped", shape_config("gemma4-e4b"), owners,
                                                       prompts)))
    return run_steps(steps, args.out, {"device": ck.DEV})


if __name__ == "__main__":
    sys.exit(main())
