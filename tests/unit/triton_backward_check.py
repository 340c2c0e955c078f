"""The Triton backward kernels under Triton's CPU interpreter, against float64 autograd.

Run by tests/unit/test_autograd.py with TRITON_INTERPRET=1 (a separate process: the variable must be
set before triton is imported). The kernels are fed the exact O and LSE, so what is left is their
FP16 products and FP32 accumulation (and, for the quantized backward, its INT8 products, to a looser bar):
a wrong tile, mask, group or scale fails by far. float16 only:
the interpreter of Triton 3.8 computes tl.dot of bfloat16 operands wrongly (bf16 runs on the GPU
tests). Prints "triton backward ok" at the end.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import torch
import triton.runtime.interpreter as interp

_patch = interp._patch_lang_tensor


def _patched(tensor, scope):
    _patch(tensor, scope)
    # numpy 2 refuses int() of a 1-element 1-D array, which the interpreter uses for loop bounds.
    scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))


interp._patch_lang_tensor = _patched

from sageattention import autograd  # noqa: E402
from sageattention.reference import attention_ref  # noqa: E402
from sageattention.triton import backward  # noqa: E402

MIN_COS, MAX_L1 = 0.9999, 0.01
failures = []


def check(what, got, ref, min_cos=MIN_COS, max_l1=MAX_L1):
    cos = float(got.double().flatten() @ ref.flatten() / (got.double().norm() * ref.norm()).clamp_min(1e-300))
    l1 = float((got.double() - ref).abs().sum() / ref.abs().sum().clamp_min(1e-300))
    ok = torch.isfinite(got).all() and got.abs().sum() > 0 and cos >= min_cos and l1 <= max_l1
    print(f"{what}: cos {cos:.6f} rel L1 {l1:.2e}{'' if ok else '  FAIL'}")
    if not ok:
        failures.append(what)


def reference(q, k, v, do, dlse, causal, mask, scale):
    qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
    out, lse = attention_ref(qd, kd, vd, is_causal=causal, attn_mask=mask, sm_scale=scale, return_lse=True)
    loss = (out * do.double()).sum()
    if dlse is not None:
        loss = loss + (torch.where(torch.isinf(lse), 0.0, lse) * dlse.double()).sum()
    loss.backward()
    return out.detach(), lse.detach(), (qd.grad, kd.grad, vd.grad)


gen = torch.Generator().manual_seed(0)


def randn(*shape):
    return torch.randn(*shape, generator=gen)


CASES = [
    # b, hq, hkv, nq, nk, d, layout, causal, mask, dlse, saved lse
    (1, 2, 2, 1, 17, 32, "HND", False, None, False, True),  # one query (decoding)
    (1, 2, 1, 17, 17, 32, "HND", True, None, True, True),
    (2, 2, 1, 113, 113, 64, "NHD", True, None, False, True),
    (1, 4, 2, 17, 113, 64, "HND", False, "bool", True, True),
    (1, 2, 2, 113, 17, 40, "NHD", True, "additive", False, False),
    (1, 2, 1, 33, 50, 96, "HND", True, "bool", True, False),
    (1, 2, 1, 65, 65, 64, "NHD", True, None, True, True),  # the LSE's gradient as a transposed view
]
#: The quantized backward (quant=True) on the cases of these indices, to its own bar.
QUANT_CASES = (1, 3, 4, 5)
QUANT_MIN_COS, QUANT_MAX_L1 = 0.999, 0.03
RUNS = [(case, False) for case in CASES] + [(CASES[i], True) for i in QUANT_CASES]
for (b, hq, hkv, nq, nk, d, layout, causal, mask_kind, with_dlse, with_lse), quant in RUNS:
    shape_q, shape_k = (b, hq, nq, d), (b, hkv, nk, d)
    q, k, v = randn(*shape_q).half(), randn(*shape_k).half(), randn(*shape_k).half()
    k += 2 * randn(d).half()  # a common part of the keys: what K's smoothing takes out
    do = randn(*shape_q).half()
    if layout == "NHD":  # HND views of NHD memory, as the API passes them
        q, k, v, do = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v, do))
    mask = None
    if mask_kind is not None:
        keep = torch.rand(b, 1, nq, nk, generator=gen) > 0.3
        keep[..., 0] = True
        if mask_kind == "bool":
            keep[0, 0, nq // 2] = False  # an empty row
            mask = keep
        else:
            mask = torch.where(keep, randn(b, 1, nq, nk), -math.inf).half()
    dlse = None
    if with_dlse:  # NHD: a transposed view, as autograd hands back the gradient of a merge of NHD chunks
        dlse = randn(b, nq, hq).transpose(1, 2) if layout == "NHD" else randn(b, hq, nq)
    scale = 0.3 if d == 40 else 1 / math.sqrt(d)
    out, lse, ref = reference(q, k, v, do, dlse, causal, mask, scale)
    got = backward.attention_bwd(
        do,
        q,
        k,
        v,
        out.half(),
        lse.float() if with_lse else None,
        dlse,
        attn_mask=mask,
        is_causal=causal,
        sm_scale=scale,
        quant=quant,
    )
    name = f"b{b} h{hq}/{hkv} n{nq}x{nk} d{d} {layout} causal={causal} mask={mask_kind} dlse={with_dlse}"
    name += " int8" if quant else ""
    for t, g, r, x in zip("qkv", got, ref, (q, k, v)):
        check(f"{name} d{t}", g, r, *((QUANT_MIN_COS, QUANT_MAX_L1) if quant else (MIN_COS, MAX_L1)))
        if g.stride() != x.stride():
            failures.append(f"{name} d{t} strides {g.stride()} != {x.stride()}")

# Packed sequences (the LSE is recomputed by the kernels), GQA 2:1, causal and not.
lens_q, lens_k = [5, 17, 1, 40], [9, 17, 3, 40]
cu_q = torch.tensor([0, *np.cumsum(lens_q)], dtype=torch.int32)
cu_k = torch.tensor([0, *np.cumsum(lens_k)], dtype=torch.int32)
for causal, quant in ((False, False), (True, False), (True, True)):
    q, do = randn(sum(lens_q), 4, 64).half(), randn(sum(lens_q), 4, 64).half()
    k, v = randn(sum(lens_k), 2, 64).half(), randn(sum(lens_k), 2, 64).half()
    out = torch.zeros(q.shape, dtype=torch.float64)
    refs = [torch.zeros(x.shape, dtype=torch.float64) for x in (q, k, v)]
    for i in range(len(lens_q)):
        sq, sk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        parts = [x[s].transpose(0, 1)[None] for x, s in ((q, sq), (k, sk), (v, sk), (do, sq))]
        o, _, g = reference(*parts, None, causal, None, 0.125)
        out[sq] = o[0].transpose(0, 1)
        for r, gi, s in zip(refs, g, (sq, sk, sk)):
            r[s] = gi[0].transpose(0, 1)
    got = backward.varlen_bwd(do, q, k, v, out.half(), cu_q, cu_k, 40, 40, is_causal=causal, sm_scale=0.125,
                              quant=quant)  # fmt: skip
    for t, g, r in zip("qkv", got, refs):
        check(f"varlen causal={causal}{' int8' if quant else ''} d{t}", g, r,
              *((QUANT_MIN_COS, QUANT_MAX_L1) if quant else (MIN_COS, MAX_L1)))  # fmt: skip

# The table picks the Triton backward on the CPU under the interpreter, and the glue feeds it.
q, k, v, do = (randn(1, 2, 17, 32).half() for _ in range(4))
out, lse, ref = reference(q, k, v, do, None, True, None, 0.2)
assert autograd.backward_for(q, k, is_causal=True) == "triton", autograd.backward_for(q, k, is_causal=True)
got = autograd._dense_backward(do, q, k, v, out.half(), lse.float(), None, None, True, 0.2)
for t, g, r in zip("qkv", got, ref):
    check(f"through the table d{t}", g, r)

# K centered for torch's backward kernels (which take no GQA): the Triton pass against the torch ops
# (autograd._centered on the CPU), K with a common part, the LSE as a strided view.
q, k = randn(2, 4, 33, 40).half(), (randn(2, 4, 50, 40) + 3 * randn(40)).half()
lse = randn(2, 33, 4).transpose(1, 2)
want_k, want_lse = autograd._centered(q, k, lse, 0.3)
got_k, got_lse = backward.centered(q, k, lse, 0.3)
if not torch.equal(got_k, want_k) or got_k.stride() != k.stride():
    failures.append("centered K differs from the torch ops'")
if not torch.allclose(got_lse, want_lse, rtol=0, atol=1e-4):
    failures.append(f"centered LSE differs from the torch ops' by {float((got_lse - want_lse).abs().max())}")

if failures:
    print("FAILED:", *failures, sep="\n  ")
    sys.exit(1)
print("triton backward ok")
