"""Why the rotary kernel rounds bfloat16 products on the bits: on the H200, one
token's RoPE half (Qwen3.5-4B's 16 heads, 64 of 256 features rotated) computed
four ways against torch's element-wise ops (``rotary_ref``): the shipped kernel,
products not rounded (mode 0), products rounded to nearest even on the bits
(mode 1), and the ``.to(tl.bfloat16, fp_downcast_rounding="rtne")`` round trip
(mode 2). Prints the fraction of outputs that differ.

Usage::

    python benchmark/kernels/probe_bf16_rounding.py
"""
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from flide_ext.kernels.rotary import rotary_ref  # noqa: E402
from flide_ext.kernels.rotary.kernel import rotary_triton  # noqa: E402

@triton.jit
def _rtne_bf16(x):
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)

@triton.jit
def _k(X, COS, SIN, OUT, H, D, R, sxt, sxh, MODE: tl.constexpr, BH: tl.constexpr, BHALF: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BH); j = tl.arange(0, BHALF); half = R // 2
    ok = (h < H)[:, None] & (j < half)[None, :]
    row = X + t * sxt + h[:, None] * sxh
    a = tl.load(row + j[None, :], mask=ok, other=0.0).to(tl.float32)
    b = tl.load(row + half + j[None, :], mask=ok, other=0.0).to(tl.float32)
    c1 = tl.load(COS + t * R + j, mask=j < half).to(tl.float32)[None, :]
    s1 = tl.load(SIN + t * R + j, mask=j < half).to(tl.float32)[None, :]
    if MODE == 0:  # no product rounding
        first = a * c1 + (-b * s1)
    elif MODE == 1:  # integer RTNE
        first = _rtne_bf16(a * c1) + _rtne_bf16(-b * s1)
    else:  # cvt with an explicit rounding mode
        first = (a * c1).to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32) + (-b * s1).to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
    tl.store(OUT + t * H * half + h[:, None] * half + j[None, :], first.to(tl.bfloat16), mask=ok)

T, H, D, R = 735, 16, 256, 64
gen = torch.Generator(device="cuda").manual_seed(0)
q = (3 * torch.randn(T, H, 512, generator=gen, device="cuda")).to(torch.bfloat16)[..., :D]
pos = torch.randint(0, 4000, (T,), device="cuda")
inv = 1.0 / 1e7 ** (torch.arange(0, R, 2, device="cuda").float() / R)
emb = torch.cat([pos.float()[:, None] * inv] * 2, -1)
cos, sin = emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)
want = rotary_ref(q, cos, sin)[..., : R // 2]
got = rotary_triton(q, cos, sin)[..., : R // 2]
print("current kernel differing", (got != want).float().mean().item())
for mode in (0, 1, 2):
    out = torch.empty(T, H, R // 2, dtype=torch.bfloat16, device="cuda")
    _k[(T,)](q, cos, sin, out, H, D, R, q.stride(0), q.stride(1), MODE=mode, BH=16, BHALF=32)
    print("mode", mode, "differing vs reference", (out != want).float().mean().item(), "vs current", (out != got).float().mean().item())
# torch's own two-step on the first half
a, b = q[..., :32], q[..., 32:64]
man = (a * cos[:, None, :32]) + ((-b) * sin[:, None, :32])
print("torch manual vs reference", (man != want).float().mean().item())
