"""bench/pv_candidates.py simulates P·V encodings for the sm90 kernel: its "fp8" candidate must compute
what the library's reference computes for the kernel (sage_ref, FP8 P·V, the rounded row sum), and every
candidate must run and stay near exact attention, so that its figures can be trusted."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import pv_candidates  # noqa: E402

from sageattention.quant import PVDtype  # noqa: E402
from sageattention.reference import attention_ref, sage_ref  # noqa: E402


def test_fp8_candidate_is_the_kernels_reference():
    q, k, v = pv_candidates.inputs("outlier", 300, "cpu")
    got = pv_candidates.simulate(q, k, v, "fp8")
    want = sage_ref(q, k, v, pv=PVDtype.FP8, block_m=1, block_n=128, rowsum="rounded")
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)


def test_every_candidate_runs_near_exact_attention():
    q, k, v = pv_candidates.inputs("randn", 257, "cpu")
    ref = attention_ref(q.double(), k.double(), v.double()).float()
    for how in pv_candidates.CANDIDATES:
        out = pv_candidates.simulate(q, k, v, how)
        cos = torch.nn.functional.cosine_similarity(out.flatten().double(), ref.flatten().double(), dim=0)
        assert out.shape == ref.shape and cos > 0.998, (how, float(cos))
