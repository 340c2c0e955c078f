"""Every argument check of the public API: the right exception, and a message naming the argument.

Each case is one bad input; the calls run on the CPU, where a good call would reach the SDPA
fallback, so a check that is missing shows up as a failure to raise (or a different error).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import sageattention as sa

BF16 = torch.bfloat16


def qkv(b=1, hq=4, hkv=2, nq=8, nk=8, d=16, dtype=BF16):
    return (
        torch.randn(b, hq, nq, d, dtype=dtype),
        torch.randn(b, hkv, nk, d, dtype=dtype),
        torch.randn(b, hkv, nk, d, dtype=dtype),
    )


def packed(tq=10, tk=12, hq=4, hkv=2, d=16):
    q = torch.randn(tq, hq, d, dtype=BF16)
    k, v = torch.randn(tk, hkv, d, dtype=BF16), torch.randn(tk, hkv, d, dtype=BF16)
    return q, k, v, torch.tensor([0, 4, tq], dtype=torch.int32), torch.tensor([0, 5, tk], dtype=torch.int32)


def with_qkv(**over):
    q, k, v = qkv()
    args = {"q": q, "k": k, "v": v}
    args.update(over)
    return args


def dense(fn=sa.sageattn, **over):
    args = with_qkv(**{k: v for k, v in over.items() if k in ("q", "k", "v")})
    rest = {k: v for k, v in over.items() if k not in ("q", "k", "v")}
    return lambda: fn(args["q"], args["k"], args["v"], **rest)


def varlen(**over):
    q, k, v, cq, ck = packed()
    args = {
        "q": q,
        "k": k,
        "v": v,
        "cu_seqlens_q": cq,
        "cu_seqlens_k": ck,
        "max_seqlen_q": 6,
        "max_seqlen_k": 7,
    }
    args.update(over)
    return lambda: sa.sageattn_varlen(**args)


q0, k0, v0 = qkv()
tq0, tk0, tv0, cq0, ck0 = packed()

CASES = [
    # name, call, exception, regex the message must match
    ("q_not_tensor", dense(q=[1.0]), TypeError, r"^q must be a torch.Tensor"),
    ("k_not_tensor", dense(k=None), TypeError, r"^k must be a torch.Tensor"),
    ("v_not_tensor", dense(v=3), TypeError, r"^v must be a torch.Tensor"),
    ("q_int", dense(q=torch.ones(1, 4, 8, 16, dtype=torch.int32)), TypeError, r"^q has dtype torch.int32"),
    (
        "k_float32",
        dense(k=k0.float()),
        TypeError,
        r"^k has dtype torch.float32.*k.half\(\) or k.bfloat16\(\)",
    ),
    ("v_float64", dense(v=v0.double()), TypeError, r"^v has dtype torch.float64"),
    ("mixed_dtypes", dense(k=k0.half(), v=v0.half()), TypeError, r"q, k and v must have the same dtype"),
    ("q_3d", dense(q=q0[0]), ValueError, r"^q must have 4 dimensions"),
    ("v_5d", dense(v=v0[None]), ValueError, r"^v must have 4 dimensions"),
    ("layout", dense(tensor_layout="BHND"), ValueError, r"tensor_layout='BHND'.*'HND', 'NHD'"),
    ("layout_lower", dense(tensor_layout="nhd"), ValueError, r"tensor_layout='nhd'"),
    (
        "batch",
        dense(k=torch.randn(2, 2, 8, 16, dtype=BF16), v=torch.randn(2, 2, 8, 16, dtype=BF16)),
        ValueError,
        r"same batch size",
    ),
    (
        "head_dim_k",
        dense(k=torch.randn(1, 2, 8, 32, dtype=BF16), v=torch.randn(1, 2, 8, 32, dtype=BF16)),
        ValueError,
        r"same head_dim",
    ),
    (
        "kv_shapes",
        dense(v=torch.randn(1, 2, 9, 16, dtype=BF16)),
        ValueError,
        r"k and v must have the same shape",
    ),
    (
        "v_head_dim",
        dense(v=torch.randn(1, 2, 8, 32, dtype=BF16)),
        ValueError,
        r"k and v must have the same shape",
    ),
    (
        "gqa_ratio",
        dense(k=torch.randn(1, 3, 8, 16, dtype=BF16), v=torch.randn(1, 3, 8, 16, dtype=BF16)),
        ValueError,
        r"q heads \(4\) must be a multiple of the number of k/v heads \(3\)",
    ),
    (
        "head_dim_zero",
        dense(
            q=torch.randn(1, 4, 8, 0, dtype=BF16),
            k=torch.randn(1, 2, 8, 0, dtype=BF16),
            v=torch.randn(1, 2, 8, 0, dtype=BF16),
        ),
        ValueError,
        r"head_dim .* at least 1",
    ),
    (
        "kv_no_heads",
        dense(k=torch.randn(1, 0, 8, 16, dtype=BF16), v=torch.randn(1, 0, 8, 16, dtype=BF16)),
        ValueError,
        r"k and v have no heads while q has 4",
    ),
    (
        "last_dim_strided",
        dense(q=torch.randn(1, 4, 8, 32, dtype=BF16)[..., ::2]),
        ValueError,
        r"^q must have a contiguous last dimension.*q.contiguous\(\)",
    ),
    ("sm_scale_zero", dense(sm_scale=0.0), ValueError, r"sm_scale must be a positive finite number"),
    ("sm_scale_negative", dense(sm_scale=-0.1), ValueError, r"sm_scale must be a positive"),
    ("sm_scale_nan", dense(sm_scale=float("nan")), ValueError, r"sm_scale must be a positive finite"),
    ("sm_scale_inf", dense(sm_scale=float("inf")), ValueError, r"sm_scale must be a positive finite"),
    ("sm_scale_str", dense(sm_scale="0.1"), TypeError, r"sm_scale must be a Python float"),
    ("sm_scale_tensor", dense(sm_scale=torch.tensor(0.1)), TypeError, r"sm_scale must be a Python float"),
    ("sm_scale_bool", dense(sm_scale=True), TypeError, r"sm_scale must be a Python float"),
    ("is_causal_str", dense(is_causal="yes"), TypeError, r"is_causal must be a bool"),
    ("is_causal_tensor", dense(is_causal=torch.tensor(True)), TypeError, r"is_causal must be a bool"),
    ("return_lse_none", dense(return_lse=None), TypeError, r"return_lse must be a bool"),
    ("smooth_k_str", dense(smooth_k="no"), TypeError, r"smooth_k must be a bool"),
    ("smooth_v_str", dense(smooth_v="no"), TypeError, r"smooth_v must be a bool"),
    (
        "unknown_kwarg",
        dense(atn_mask=None),
        TypeError,
        r"sageattn\(\) got unexpected keyword argument\(s\) 'atn_mask'"
        r".*valid extra keyword arguments: attn_mask, qk_quant_gran",
    ),
    (
        "unknown_kwargs_variant",
        dense(sa.sageattn_qk_int8_pv_fp16_triton, dropout_p=0.1, scale=1.0),
        TypeError,
        r"sageattn_qk_int8_pv_fp16_triton\(\) got unexpected keyword argument\(s\) 'dropout_p', 'scale'",
    ),
    ("qk_quant_gran", dense(qk_quant_gran="per_tensor"), ValueError, r"qk_quant_gran='per_tensor'.*per_warp"),
    (
        "qk_quant_gran_cuda",
        dense(sa.sageattn_qk_int8_pv_fp16_cuda, qk_quant_gran="per_block"),
        ValueError,
        r"qk_quant_gran='per_block' is not supported here; valid values: per_warp, per_thread",
    ),
    ("pv_accum", dense(pv_accum_dtype="fp64"), ValueError, r"pv_accum_dtype='fp64'"),
    (
        "pv_accum_fp16_cuda",
        dense(sa.sageattn_qk_int8_pv_fp16_cuda, pv_accum_dtype="fp32+fp16"),
        ValueError,
        r"pv_accum_dtype='fp32\+fp16' is not supported here; valid values: fp32, fp16\+fp32$",
    ),
    (
        "pv_accum_fp16_cuda_no_fp16",  # whole-sequence FP16 accumulation: no kernel has it
        dense(sa.sageattn_qk_int8_pv_fp16_cuda, pv_accum_dtype="fp16"),
        ValueError,
        r"pv_accum_dtype='fp16' is not supported here; valid values: fp32, fp16\+fp32$",
    ),
    (
        "pv_accum_fp8_cuda",
        dense(sa.sageattn_qk_int8_pv_fp8_cuda, pv_accum_dtype="fp16"),
        ValueError,
        r"pv_accum_dtype='fp16' is not supported here",
    ),
    (
        "pv_accum_sm90",
        dense(sa.sageattn_qk_int8_pv_fp8_cuda_sm90, pv_accum_dtype="fp32"),
        ValueError,
        r"pv_accum_dtype='fp32' is not supported here; valid values: fp32\+fp32",
    ),
    (
        "quantization_backend",
        dense(quantization_backend="numpy"),
        ValueError,
        r"quantization_backend='numpy'.*'triton', 'cuda'",
    ),
    ("mask_not_tensor", dense(attn_mask=[[True]]), TypeError, r"attn_mask must be a torch.Tensor or None"),
    (
        "mask_int",
        dense(attn_mask=torch.ones(8, 8, dtype=torch.int64)),
        TypeError,
        r"attn_mask has dtype torch.int64",
    ),
    (
        "mask_shape",
        dense(attn_mask=torch.ones(8, 9, dtype=torch.bool)),
        ValueError,
        r"attn_mask of shape \(8, 9\) is not broadcastable to .* \[1, 4, 8, 8\]",
    ),
    (
        "mask_heads",
        dense(attn_mask=torch.ones(1, 2, 8, 8, dtype=torch.bool)),
        ValueError,
        r"attn_mask of shape \(1, 2, 8, 8\)",
    ),
    (
        "mask_1d",
        dense(attn_mask=torch.ones(8, dtype=torch.bool)),
        ValueError,
        r"attn_mask .* 2 to 4 dimensions",
    ),
    (
        "mask_5d",
        dense(attn_mask=torch.ones(1, 1, 1, 8, 8, dtype=torch.bool)),
        ValueError,
        r"attn_mask of shape",
    ),
    (
        "head_dim_variant",
        dense(
            sa.sageattn_qk_int8_pv_fp16_triton,
            q=torch.randn(1, 4, 8, 160, dtype=BF16),
            k=torch.randn(1, 2, 8, 160, dtype=BF16),
            v=torch.randn(1, 2, 8, 160, dtype=BF16),
        ),
        ValueError,
        r"sageattn_qk_int8_pv_fp16_triton\(\): head_dim=160 is larger than 128.*use sageattn\(\)",
    ),
    # varlen
    ("varlen_q_4d", varlen(q=tq0[None]), ValueError, r"^q must have 3 dimensions"),
    ("varlen_k_float32", varlen(k=tk0.float()), TypeError, r"^k has dtype torch.float32"),
    (
        "varlen_heads",
        varlen(q=torch.randn(10, 3, 16, dtype=BF16)),
        ValueError,
        r"multiple of the number of k/v",
    ),
    ("cu_not_tensor", varlen(cu_seqlens_q=[0, 4, 10]), TypeError, r"^cu_seqlens_q must be a torch.Tensor"),
    ("cu_float", varlen(cu_seqlens_k=ck0.float()), TypeError, r"^cu_seqlens_k has dtype torch.float32"),
    ("cu_2d", varlen(cu_seqlens_q=cq0[None]), ValueError, r"^cu_seqlens_q must be 1-D"),
    ("cu_short", varlen(cu_seqlens_q=cq0[:1]), ValueError, r"^cu_seqlens_q must be 1-D with batch \+ 1 >= 2"),
    (
        "cu_lengths",
        varlen(cu_seqlens_k=torch.tensor([0, 12], dtype=torch.int32)),
        ValueError,
        r"cu_seqlens_q and cu_seqlens_k must have the same length",
    ),
    (
        "cu_start",
        varlen(cu_seqlens_q=torch.tensor([1, 4, 10], dtype=torch.int32)),
        ValueError,
        r"cu_seqlens_q must start at 0",
    ),
    (
        "cu_decreasing",
        varlen(
            cu_seqlens_k=torch.tensor([0, 8, 5, 12], dtype=torch.int32),
            cu_seqlens_q=torch.tensor([0, 2, 4, 10], dtype=torch.int32),
        ),
        ValueError,
        r"cu_seqlens_k must be non-decreasing",
    ),
    (
        "cu_end",
        varlen(cu_seqlens_q=torch.tensor([0, 4, 9], dtype=torch.int32)),
        ValueError,
        r"cu_seqlens_q must end at the number of tokens \(10\)",
    ),
    ("max_seqlen_small", varlen(max_seqlen_k=3), ValueError, r"max_seqlen_k=3 is smaller than the longest"),
    ("max_seqlen_zero", varlen(max_seqlen_q=0), ValueError, r"max_seqlen_q must be at least 1"),
    ("max_seqlen_float", varlen(max_seqlen_q=6.0), TypeError, r"max_seqlen_q must be a Python int"),
    (
        "max_seqlen_tensor",
        varlen(max_seqlen_k=torch.tensor(7)),
        TypeError,
        r"max_seqlen_k must be a Python int",
    ),
    (
        "varlen_unknown_kwarg",
        varlen(attn_mask=None),
        TypeError,
        r"sageattn_varlen\(\) got unexpected keyword argument\(s\) 'attn_mask'",
    ),
    ("varlen_sm_scale", varlen(sm_scale=-1.0), ValueError, r"sm_scale must be a positive"),
]


@pytest.mark.parametrize("call,exc,pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_argument(call, exc, pattern):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a call that wrongly passes the checks falls back with a warning
        with pytest.raises(exc, match=pattern):
            call()


def test_every_case_has_a_unique_name():
    names = [c[0] for c in CASES]
    assert len(names) == len(set(names))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device type")
def test_devices_must_match():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"q, k and v must be on the same device"):
        sa.sageattn(q, k.cuda(), v.cuda())


def test_mask_device_must_match_q():
    q, k, v = qkv()
    mask = torch.ones(8, 8, dtype=torch.bool, device="meta")
    with pytest.raises(ValueError, match=r"attn_mask must be on the same device as q"):
        sa.sageattn(q, k, v, attn_mask=mask)


def test_qkv_devices_must_match_meta():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"q, k and v must be on the same device"):
        sa.sageattn(q, k.to("meta"), v)


def test_cu_seqlens_device_must_match_q():
    q, k, v, cq, ck = packed()
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be on the same device as q"):
        sa.sageattn_varlen(q, k, v, cq.to("meta"), ck, 6, 7)


def test_int64_cu_seqlens_are_accepted():
    q, k, v, cq, ck = packed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = sa.sageattn_varlen(q, k, v, cq.long(), ck.long(), 6, 7)
    assert out.shape == q.shape


def test_int_flags_are_taken_as_bools():
    q, k, v = qkv()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = sa.sageattn(q, k, v, is_causal=1)
        b = sa.sageattn(q, k, v, is_causal=True)
    torch.testing.assert_close(a, b)


def test_checks_run_before_the_backend_is_looked_up():
    """A bad argument to a variant that is not built reports the argument, not the missing build."""
    q, k, v = qkv()
    with pytest.raises(ValueError, match="tensor_layout"):
        sa.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v, tensor_layout="XYZ")


@pytest.mark.parametrize("arch", ["sm80", "sm89"])
def test_launchers_check_pv_accum_before_loading_their_extensions(arch):
    """The compiled launchers name a bad pv_accum and the family's valid values; with a valid one they
    go on to the extensions (RuntimeError saying which is not built in a source tree; in an installed
    wheel, that CPU tensors are not CUDA tensors)."""
    from sageattention import cuda_sm80, cuda_sm89

    launcher = {"sm80": cuda_sm80.attention_sm80, "sm89": cuda_sm89.attention_sm89}[arch]
    accums = {"sm80": cuda_sm80.PV_ACCUMS, "sm89": cuda_sm89.PV_ACCUMS}[arch]
    q, k, v = qkv()
    flags = {"is_causal": False, "sm_scale": 0.25, "smooth_k": True, "return_lse": False}
    bad = rf"pv_accum='fp8' is not supported by the {arch} kernel; valid values"
    with pytest.raises(ValueError, match=bad):
        launcher(q, k, v, pv_accum="fp8", **flags)
    with pytest.raises(RuntimeError, match="is not available|must be a CUDA tensor"):
        launcher(q, k, v, pv_accum=accums[0], **flags)
    with pytest.raises(ValueError, match="head dim"):
        launcher(q[..., :3], k[..., :3], v[..., :3], pv_accum=accums[0], **flags)


def test_sm90_launcher_checks_its_inputs_before_loading_its_extensions():
    """The sm_90a launcher has no pv_accum choice: its inputs are checked, then the extensions loaded
    (RuntimeError: not built in a source tree; CPU tensors in an installed wheel)."""
    from sageattention import cuda_sm90

    q, k, v = qkv()
    flags = {"is_causal": False, "sm_scale": 0.25, "smooth_k": True, "return_lse": False}
    with pytest.raises(RuntimeError, match="is not available|must be a CUDA tensor"):
        cuda_sm90.attention_sm90(q, k, v, **flags)
    with pytest.raises(ValueError, match="head dim"):
        cuda_sm90.attention_sm90(q[..., :3], k[..., :3], v[..., :3], **flags)
