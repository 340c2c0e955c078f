"""The LSE contract of ring attention through the quantized backends (sageattn and each named variant on
a CUDA GPU; tests/unit/test_lse_merge.py holds the same checks on the CPU fallback).

Attention over chunks of the keys and values, each call with ``return_lse=True``, merged as
``lse = logsumexp_i lse_i`` and ``out = sum_i exp(lse_i - lse) * out_i``, is the attention over all of
them. Each chunk is quantized on its own (K smoothed by the chunk's mean, the LSE corrected for it), so
the merge is held to the bounds of one quantized call against float64 attention_ref: conftest's
EXACT_BOUNDS for the output (FP16 P·V cosine >= 0.9999, rel L1 <= 0.015; FP8 0.9992, 0.04) and 5e-2 for
the LSE (tests/gpu/test_cuda_kernels.py test_against_float64: the first causal rows see a few keys and
keep the full INT8 error of their scores); the merge against the unchunked call within the same LSE
bound. A merge that double-counts or drops a chunk moves the LSE by O(1) (log 2) and cannot pass.
Causal: query block j against key chunks 0..j-1 (non-causal) and its own chunk (causal, as many keys as
queries, so top-left alignment is exact). Gradients through the merge (each chunk's output and LSE)
against float64 autograd of the unchunked attention: cosine >= 0.999 and rel L1 <= 0.04 (the bounds of
tests/gpu/test_backward.py for calls with an LSE gradient).
"""

from __future__ import annotations

import pytest
import torch

from sageattention.reference import attention_ref

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

LSE_ATOL = 5e-2
GRAD_MIN_COS, GRAD_MAX_L1 = 0.999, 0.04
N = 1536


def _inputs(layout, hq, hkv, n, d=128, seed=0, requires_grad=False):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def make(h):
        shape = (1, h, n, d) if layout == "HND" else (1, n, h, d)
        x = torch.randn(shape, device="cuda", generator=gen).bfloat16()
        return x.requires_grad_() if requires_grad else x

    return make(hq), make(hkv), make(hkv)


def _hnd(x, layout):
    """[B, H, N, D] views (where_it_differs reads the tiling of the rows from them)."""
    return x if layout == "HND" else x.transpose(1, 2)


def _pv(backend):
    return backend.resolve().pv


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("hkv", [8, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_chunks_merge_to_the_full_result(sage_backend, metrics, mma, chunks, layout, parts, hkv, causal):
    q, k, v = _inputs(layout, 8, hkv, N, seed=parts + 10 * causal)
    bounds = chunks.bounds(N, parts)
    out, lse = (chunks.causal_blocks if causal else chunks.ring)(sage_backend.call, q, k, v, layout, bounds)
    full_out, full_lse = sage_backend.call(q, k, v, tensor_layout=layout, is_causal=causal, return_lse=True)
    ref_out, ref_lse = attention_ref(q, k, v, tensor_layout=layout, is_causal=causal, return_lse=True)
    assert out.shape == q.shape and lse.shape == full_lse.shape and lse.dtype == torch.float32
    what = f"{sage_backend.name} {layout} parts={parts} hkv={hkv} causal={causal}"
    out, full_out, ref_out = (_hnd(x, layout) for x in (out, full_out, ref_out))
    stats = mma.check_exact(metrics, out, ref_out, _pv(sage_backend), f"{what}: merged vs float64")
    print(f"{what} merged vs float64: {metrics.fmt(stats)}")
    mma.check_exact(metrics, full_out, ref_out, _pv(sage_backend), f"{what}: unchunked vs float64")
    mma.check_lse(lse, ref_lse, atol=LSE_ATOL, what=f"{what}: merged lse vs float64")
    mma.check_lse(lse, full_lse, atol=LSE_ATOL, what=f"{what}: merged lse vs the unchunked call")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_gradients_through_the_merge(sage_backend, chunks, layout, causal):
    q, k, v = _inputs(layout, 8, 2, N, seed=30 + causal, requires_grad=True)
    bounds = chunks.bounds(N, 3)
    out, lse = (chunks.causal_blocks if causal else chunks.ring)(sage_backend.call, q, k, v, layout, bounds)
    gen = torch.Generator(device="cuda").manual_seed(7)
    dout = torch.randn(out.shape, device="cuda", generator=gen)
    dlse = torch.randn(lse.shape, device="cuda", generator=gen)
    torch.autograd.backward((out, lse), (dout, dlse))
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref_out, ref_lse = attention_ref(qd, kd, vd, tensor_layout=layout, is_causal=causal, return_lse=True)
    ref = torch.autograd.grad((ref_out * dout.double()).sum() + (ref_lse * dlse.double()).sum(), (qd, kd, vd))
    for name, x, r in zip("qkv", (q, k, v), ref):
        g = x.grad
        what = f"{sage_backend.name} {layout} causal={causal} d{name}"
        assert g is not None, f"{what}: no gradient"
        assert torch.isfinite(g).all(), f"{what}: NaN or Inf"
        gd, rd = g.double().flatten(), r.flatten()
        cos = float(gd @ rd / (gd.norm() * rd.norm()).clamp_min(1e-300))
        l1 = float((gd - rd).abs().sum() / rd.abs().sum())
        print(f"{what}: cos {cos:.6f} rel L1 {l1:.5f}")
        assert cos >= GRAD_MIN_COS and l1 <= GRAD_MAX_L1, (
            f"{what}: cos {cos:.6f} (>= {GRAD_MIN_COS}), rel L1 {l1:.5f} (<= {GRAD_MAX_L1})"
        )
