"""sageattn_varlen on a GPU: each packed sequence against sage_ref run on that sequence alone (so K is
smoothed per sequence), with GQA, causal, q_len != kv_len, both P·V precisions."""

from __future__ import annotations

import pytest
import torch

import sageattention as sa
from sageattention.quant import PVDtype
from sageattention.reference import attention_ref, sage_ref

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
kernels = pytest.importorskip("sageattention.triton")


def packed(lens_q, lens_k, hq, hkv, d, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen).to(torch.bfloat16)

    q, k, v = randn(sum(lens_q), hq, d), randn(sum(lens_k), hkv, d), randn(sum(lens_k), hkv, d)
    # a different channel offset per sequence: only per-sequence smoothing removes it exactly
    offsets = randn(len(lens_k), 1, d) * 6
    k = k + offsets.repeat_interleave(torch.tensor(lens_k, device="cuda"), dim=0)
    cu_q = torch.tensor([0, *lens_q], device="cuda").cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0, *lens_k], device="cuda").cumsum(0).to(torch.int32)
    return q, k, v, cu_q, cu_k


def _varlen_pv() -> PVDtype:
    """The P·V precision sageattn_varlen uses on this GPU."""
    from sageattention import dispatch

    return dispatch.BACKENDS[dispatch.explain(torch.device("cuda"))["backend"]].pv


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 72])
def test_varlen_matches_each_sequence(metrics, causal, d):
    pv = _varlen_pv()
    lens_q, lens_k = [1, 17, 113, 1000, 300, 64], [1, 40, 113, 1000, 4095, 64]
    q, k, v, cu_q, cu_k = packed(lens_q, lens_k, 8, 2, d, seed=d)
    fn = sa.sageattn_varlen
    out = fn(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), is_causal=causal)
    assert out.shape == q.shape and out.dtype == q.dtype
    metrics.assert_finite(out)
    bq, bk = cu_q.tolist(), cu_k.tolist()
    for i in range(len(lens_q)):
        sq, sk, sv = (
            x.unsqueeze(0) for x in (q[bq[i] : bq[i + 1]], k[bk[i] : bk[i + 1]], v[bk[i] : bk[i + 1]])
        )
        ref = sage_ref(sq, sk, sv, tensor_layout="NHD", is_causal=causal, **kernels.reference_options(pv, d))
        got = out[bq[i] : bq[i + 1]].unsqueeze(0)
        metrics.assert_tight(got, ref, pv, f"sequence {i}")
        exact = attention_ref(sq, sk, sv, tensor_layout="NHD", is_causal=causal)
        assert metrics.cosine(got, exact) >= (0.9999 if pv is PVDtype.FP16 else 0.999), f"sequence {i}"


def test_varlen_on_fp16_kernels_via_pretend_arch(metrics, monkeypatch):
    """The FP16 P·V varlen path, reached on any GPU by pretending to be sm86."""
    from sageattention import dispatch

    monkeypatch.setattr(dispatch, "device_capability", lambda t, i: (8, 6))
    lens = [5, 700, 129]
    q, k, v, cu_q, cu_k = packed(lens, lens, 4, 4, 128, seed=1)
    out = sa.sageattn_varlen(q, k, v, cu_q, cu_k, max(lens), max(lens), is_causal=True)
    b = cu_q.tolist()
    for i in range(len(lens)):
        s = slice(b[i], b[i + 1])
        sq, sk, sv = q[s][None], k[s][None], v[s][None]
        ref = sage_ref(
            sq, sk, sv, tensor_layout="NHD", is_causal=True, **kernels.reference_options(PVDtype.FP16, 128)
        )
        metrics.assert_tight(out[s][None], ref, PVDtype.FP16, f"sequence {i}")
