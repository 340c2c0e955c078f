"""The API's route to the Triton kernels, on the CPU: a stand-in plays sageattention.triton (it runs
sage_ref) and the CPU pretends to be a GPU of a given capability. What is checked is the plumbing:
which kernel, which options, views not copies, output memory layout, LSE, the custom ops."""

from __future__ import annotations

import math

import pytest
import torch

import sageattention as sa
from sageattention.quant import PVDtype
from sageattention.reference import sage_ref


def test_sm90_gets_fp8_and_nhd_views(inputs, triton_standin):
    q, k, v = inputs.make_qkv(2, 8, 2, 19, 23, 64, layout="NHD")
    out = sa.sageattn(q, k, v, tensor_layout="NHD", is_causal=True)
    (call,) = triton_standin.calls
    assert call["pv"] is PVDtype.FP8 and call["is_causal"] and call["smooth_k"]
    assert call["sm_scale"] == pytest.approx(1 / math.sqrt(64))
    for name, x in (("q", q), ("k", k), ("v", v)):  # HND views of the caller's memory, nothing copied
        assert call[name].data_ptr() == x.data_ptr() and call[name].shape == x.transpose(1, 2).shape
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    ref = sage_ref(q, k, v, tensor_layout="NHD", is_causal=True, pv=PVDtype.FP8, block_m=1, block_n=64)
    torch.testing.assert_close(out, ref.to(out.dtype))


FP16, FP8 = PVDtype.FP16, PVDtype.FP8


@pytest.mark.parametrize(
    "capability,pv", [((8, 0), FP16), ((8, 6), FP16), ((8, 9), FP8), ((12, 0), FP8), ((10, 3), FP16)]
)
def test_pv_precision_follows_the_arch(inputs, triton_standin, capability, pv):
    triton_standin.set_capability(capability)
    q, k, v = inputs.make_qkv()
    sa.sageattn(q, k, v)
    assert triton_standin.calls[-1]["pv"] is pv


def test_named_triton_variants(inputs, triton_standin):
    q, k, v = inputs.make_qkv(1, 4, 4, 9, 9, 32)
    sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, smooth_k=False, sm_scale=0.2)
    sa.sageattn_qk_int8_pv_fp8_triton(q, k, v, is_causal=True)
    fp16, fp8 = triton_standin.calls
    assert fp16["pv"] is PVDtype.FP16 and not fp16["smooth_k"] and fp16["sm_scale"] == 0.2
    assert fp8["pv"] is PVDtype.FP8 and fp8["is_causal"]
    triton_standin.set_capability((8, 6))
    with pytest.raises(
        RuntimeError, match=r"sageattn_qk_int8_pv_fp8_triton\(\) cannot run here .*needs sm89"
    ):
        sa.sageattn_qk_int8_pv_fp8_triton(q, k, v)


def test_cuda_variants_say_they_are_not_built(inputs, triton_standin):
    q, k, v = inputs.make_qkv()
    for fn, ext in [
        (sa.sageattn_qk_int8_pv_fp16_cuda, "_qattn_sm80"),
        (sa.sageattn_qk_int8_pv_fp8_cuda, "_qattn_sm89"),
        (sa.sageattn_qk_int8_pv_fp8_cuda_sm90, "_qattn_sm90"),
    ]:
        pattern = (
            rf"^{fn.__name__}\(\) is not built in this installation \(reason: "
            rf"sageattention.{ext} could not be imported .*use sageattn\(\) which picks"
        )
        with pytest.raises(RuntimeError, match=pattern):
            fn(q, k, v)
    assert triton_standin.calls == []


def test_mask_and_lse_pass_through(inputs, triton_standin):
    q, k, v = inputs.make_qkv(2, 4, 2, 12, 15, 32)
    mask = torch.randn(2, 1, 12, 15)
    out, lse = sa.sageattn(q, k, v, attn_mask=mask, is_causal=True, return_lse=True)
    (call,) = triton_standin.calls
    assert call["attn_mask"] is mask and call["return_lse"] and call["is_causal"]
    assert lse.shape == (2, 4, 12) and lse.dtype == torch.float32
    _, ref_lse = sage_ref(q, k, v, attn_mask=mask, is_causal=True, pv=PVDtype.FP8, block_m=1, block_n=64,
                          return_lse=True)  # fmt: skip
    torch.testing.assert_close(lse, ref_lse)


def test_options_are_accepted_and_do_not_change_the_triton_call(inputs, triton_standin):
    q, k, v = inputs.make_qkv()
    sa.sageattn(q, k, v, qk_quant_gran="per_warp", pv_accum_dtype="fp32+fp32", smooth_v=True)
    sa.sageattn(q, k, v)
    a, b = triton_standin.calls
    assert all(a[key] == b[key] for key in ("pv", "is_causal", "sm_scale", "smooth_k", "return_lse"))


def test_varlen_route(triton_standin):
    cq = torch.tensor([0, 3, 10], dtype=torch.int64)
    ck = torch.tensor([0, 6, 8], dtype=torch.int64)
    q, k, v = torch.randn(10, 4, 32).half(), torch.randn(8, 2, 32).half(), torch.randn(8, 2, 32).half()
    out = sa.sageattn_varlen(q, k, v, cq, ck, 7, 6, is_causal=True)
    (call,) = triton_standin.calls
    assert call["cu_q"].dtype == torch.int32 and call["cu_k"].dtype == torch.int32
    assert (call["max_q"], call["max_k"], call["pv"], call["is_causal"]) == (7, 6, PVDtype.FP8, True)
    assert out.shape == q.shape and out.dtype == q.dtype


def test_custom_ops_are_registered_with_fakes(inputs, triton_standin):
    q, k, v = inputs.make_qkv(1, 4, 2, 9, 11, 32, layout="NHD")
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    mask = torch.ones(9, 11, dtype=torch.bool)
    op = torch.ops.sageattention.triton_attn.default
    for lse in (False, True):
        torch.library.opcheck(op, (qh, kh, vh, mask, True, 0.2, "fp8", True, lse, "triton"))
        torch.library.opcheck(op, (qh, kh, vh, None, False, 0.2, "fp16", False, lse, "triton"))
    cq, ck = torch.tensor([0, 4, 10], dtype=torch.int32), torch.tensor([0, 5, 12], dtype=torch.int32)
    pq, pk, pv = torch.randn(10, 4, 32).half(), torch.randn(12, 2, 32).half(), torch.randn(12, 2, 32).half()
    torch.library.opcheck(
        torch.ops.sageattention.triton_varlen.default, (pq, pk, pv, cq, ck, 6, 7, True, 0.2, "fp16", True)
    )


def test_op_output_strides_match_the_fake(inputs, triton_standin):
    """The fake (used by torch.compile) must predict the real output's layout: NHD memory for NHD views."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v = inputs.make_qkv(1, 4, 2, 9, 11, 32, layout="NHD")
    args = [x.transpose(1, 2) for x in (q, k, v)]
    real_out, real_lse = torch.ops.sageattention.triton_attn(
        *args, None, False, 0.2, "fp16", True, True, "triton"
    )
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(x) for x in args]
        fake_out, fake_lse = torch.ops.sageattention.triton_attn(
            *fake_args, None, False, 0.2, "fp16", True, True, "triton"
        )
    assert fake_out.shape == real_out.shape and fake_out.stride() == real_out.stride()
    assert fake_lse.shape == real_lse.shape and fake_lse.dtype == real_lse.dtype == torch.float32
    _, no_lse = torch.ops.sageattention.triton_attn(*args, None, False, 0.2, "fp16", True, False, "triton")
    assert no_lse.shape == (0,)


def test_quantization_backend_cuda_needs_the_compiled_ops(inputs, triton_standin, monkeypatch):
    from sageattention import ops

    q, k, v = inputs.make_qkv(1, 4, 4, 9, 9, 32)
    monkeypatch.setattr(ops, "fused_quant_unavailable_reason", lambda: "sageattention._fused is not built")
    with pytest.raises(RuntimeError, match=r"quantization_backend='cuda'.*_fused is not built"):
        sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, quantization_backend="cuda")
    monkeypatch.setattr(ops, "fused_quant_unavailable_reason", lambda: None)
    sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, quantization_backend="cuda")
    sa.sageattn(q, k, v)
    assert [c["quant_backend"] for c in triton_standin.calls] == ["cuda", "triton"]
