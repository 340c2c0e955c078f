"""The sm89-family CUDA attention kernel (csrc/sm89, op sageattention::qk_int8_sv_f8_attn_sm89) against
the simulated-quantization reference (tightly) and float64 attention (loosely), and the public API
that runs it (sageattn_qk_int8_pv_fp8_cuda). The kernel runs on every arch >= 8.9 (on sm90 mma.sync
e4m3 runs as FP16 HMMA, exactly), so an H100/H200 exercises it.

Inputs are made by sageattention.cuda_sm89.attention_sm89 with the compiled fused quantization ops,
exactly as the kernel is fed: Q INT8 per token, K minus its mean INT8 per block of 64 keys, V FP8
e4m3 per channel, transposed, keys permuted within groups of 16 (the same permutation as the sm90
kernel's: mma.sync m16n8k32 fragments are laid out like wgmma's).

Accumulations: "fp32" (every MMA into the running output), "fp32+fp32" (fresh FP32 per 64-key
block), "fp32+fp16" (FP16 per block; V quantized with amax * 256 so no block sum overflows). The last
changes V's e4m3 digits only below 4 / 448 of a channel's amax, and rounds each block sum to FP16.

Bounds. Against sage_ref(pv=FP8, block_m=1, block_n=64), conftest's TIGHT_BOUNDS[FP8]: cosine >=
0.9999 and max|out - ref| <= 0.07 max|ref|: both quantize identically; what is left is float32
summation order, exp2 (ex2.approx), FP16 rounding of block sums ("fp32+fp16") and the output
rounding. Any of them can move P * 448 across an e4m3 rounding boundary now and then; with 3
mantissa bits such a flip changes that element by up to 1/16, visible in rows with few keys. A wrong
fragment, key permutation, mask or scale gives errors of order max|ref|. The LSE shares the
reference's arithmetic: atol 2e-4. Against float64 (DESIGN.md protocol, b=1 h=8 n=4096 d=128, randn
and outlier inputs): EXACT_BOUNDS[FP8], cosine >= 0.9992 and relative L1 <= 0.04; the LSE within
5e-2 (randn) and 0.1 (outliers: Q x2 doubles the INT8 error of the one score the first causal rows
see).
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from sageattention.quant import LOG2E, PVDtype
from sageattention.reference import attention_ref, sage_ref

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
for _module in ("sageattention._qattn_sm89", "sageattention._fused"):
    try:
        importlib.import_module(_module)
    except ImportError as exc:
        pytest.skip(f"{_module} is not built: {exc}", allow_module_level=True)
_CAPABILITY = torch.cuda.get_device_capability()
if _CAPABILITY < (8, 9):
    pytest.skip(
        f"needs an sm_89 or newer GPU, this is sm_{_CAPABILITY[0]}{_CAPABILITY[1]}", allow_module_level=True
    )

import sageattention as sa  # noqa: E402
from sageattention import cuda_ops  # noqa: E402  (registers the fake implementations)
from sageattention.cuda_sm89 import KEY_BLOCK, attention_sm89, fp16_accum_available  # noqa: E402

ops = torch.ops.sageattention
SM89_MODULE = "sageattention._qattn_sm89"
FP8 = PVDtype.FP8
ACCUMS = ["fp32+fp32", "fp32+fp16", "fp32"]


def _accum_param(accum):
    marks = (
        () if accum != "fp32+fp16" or fp16_accum_available() else pytest.mark.skip("built with CUDA < 12.8")
    )
    return pytest.param(accum, marks=marks, id=accum)


ACCUM_PARAMS = [_accum_param(a) for a in ACCUMS]


def run_kernel(q, k, v, *, causal, return_lse=False, smooth_k=True, pv_accum="fp32+fp32"):
    return attention_sm89(
        q, k, v, is_causal=causal, sm_scale=q.shape[-1] ** -0.5, smooth_k=smooth_k, return_lse=return_lse,
        pv_accum=pv_accum,
    )  # fmt: skip


def reference(q, k, v, *, causal, return_lse=False, smooth_k=True):
    return sage_ref(
        q, k, v, is_causal=causal, sm_scale=q.shape[-1] ** -0.5, pv=FP8, smooth_k=smooth_k, block_m=1,
        block_n=KEY_BLOCK, return_lse=return_lse,
    )  # fmt: skip


def test_key_block_is_the_kernel_step():
    assert KEY_BLOCK == 64


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n", [1, 17, 113, 1000, 4095])
@pytest.mark.parametrize("d", [64, 128])
def test_matches_sage_ref(metrics, mma, layout, causal, n, d):
    b, hq, hkv = 2, 8, 2  # GQA: 4 query heads per KV head
    dtype = torch.bfloat16 if n % 2 else torch.float16
    q, k, v = (mma.make(b, h, n, d, layout, dtype, seed) for h, seed in ((hq, 1), (hkv, 2), (hkv, 3)))
    k = k + 2.0  # a common offset that smooth-K removes
    mma.poison_allocator(((b, hq, n, d), dtype), ((b, hq, n), torch.float32))
    out, lse = run_kernel(q, k, v, causal=causal, return_lse=True)
    assert out.shape == q.shape and out.dtype == dtype and out.stride() == torch.empty_like(q).stride()
    ref, ref_lse = reference(q, k, v, causal=causal, return_lse=True)
    mma.check_tight(metrics, out, ref, FP8)
    mma.check_lse(lse, ref_lse, atol=2e-4)


@pytest.mark.parametrize("accum", ACCUM_PARAMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n,d", [(17, 64), (1000, 128), (4095, 64)])
def test_accumulation_variants(metrics, mma, accum, causal, n, d):
    q, k, v = (mma.make(2, h, n, d, "NHD", torch.bfloat16, s) for h, s in ((4, 51), (2, 52), (2, 53)))
    mma.poison_allocator(((2, 4, n, d), torch.bfloat16), ((2, 4, n), torch.float32))
    out, lse = run_kernel(q, k, v, causal=causal, return_lse=True, pv_accum=accum)
    ref, ref_lse = reference(q, k, v, causal=causal, return_lse=True)
    mma.check_tight(metrics, out, ref, FP8, what=f"{accum} vs sage_ref")
    mma.check_lse(lse, ref_lse, atol=2e-4)


@pytest.mark.parametrize("accum", ACCUM_PARAMS)
def test_fp16_block_sums_cannot_overflow(metrics, mma, accum):
    """Every key sees the same large V (|v| up to 3e4): each 64-key block sums 64 * 448 * max|V'| in
    the accumulator, which "fp32+fp16" keeps below 65504 by its V scale. Nothing may turn Inf/NaN."""
    q = mma.make(1, 2, 256, 128, "HND", torch.float16, 54) * 0.01  # flat scores: P ~ 1 for every key
    k = mma.make(1, 2, 256, 128, "HND", torch.float16, 55)
    v = torch.full((1, 2, 256, 128), 3.0e4, device="cuda", dtype=torch.float16)
    v[..., ::2] = -3.0e4
    out, _ = run_kernel(q, k, v, causal=False, pv_accum=accum)
    mma.check_tight(metrics, out, reference(q, k, v, causal=False), FP8, what=f"{accum} vs sage_ref")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "nq,nk", [(100, 300), (300, 100), (129, 64), (64, 129), (1, 1000), (1000, 1), (17, 4095), (4095, 113)]
)
def test_different_query_and_key_lengths(metrics, mma, causal, nq, nk):
    q = mma.make(1, 4, nq, 128, "HND", torch.float16, 4)
    k, v = mma.make(1, 4, nk, 128, "HND", torch.float16, 5), mma.make(1, 4, nk, 128, "HND", torch.float16, 6)
    mma.poison_allocator(((1, 4, nq, 128), torch.float16), ((1, 4, nq), torch.float32))
    out, lse = run_kernel(q, k, v, causal=causal, return_lse=True)
    ref, ref_lse = reference(q, k, v, causal=causal, return_lse=True)
    mma.check_tight(metrics, out, ref, FP8)
    mma.check_lse(lse, ref_lse, atol=2e-4)


@pytest.mark.parametrize("d", [40, 72, 96])
def test_head_dims_below_the_tile(metrics, mma, d):
    q, k, v = (mma.make(1, 4, 333, d, "NHD", torch.bfloat16, s) for s in (7, 8, 9))
    mma.poison_allocator(((1, 4, 333, d), torch.bfloat16))
    out, _ = run_kernel(q, k, v, causal=True)
    assert out.shape == q.shape
    mma.check_tight(metrics, out, reference(q, k, v, causal=True), FP8)


@pytest.mark.parametrize("kv_group", [1, 8])
@pytest.mark.parametrize("d", [64, 128])
def test_gqa_groups(metrics, mma, kv_group, d):
    q = mma.make(1, 8, 500, d, "HND", torch.float16, 10)
    hkv = 8 // kv_group
    k, v = (
        mma.make(1, hkv, 500, d, "HND", torch.float16, 11),
        mma.make(1, hkv, 500, d, "HND", torch.float16, 12),
    )
    out, _ = run_kernel(q, k, v, causal=False)
    mma.check_tight(metrics, out, reference(q, k, v, causal=False), FP8)


@pytest.mark.parametrize("accum", [p for p in ACCUM_PARAMS if p.id != "fp32"])
@pytest.mark.parametrize("kind", ["randn", "outlier"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_against_float64(metrics, mma, kind, causal, accum):
    """The accuracy promised to users (DESIGN.md protocol)."""
    q, k, v = mma.protocol_inputs(kind, 13)
    out, lse = run_kernel(q, k, v, causal=causal, return_lse=True, pv_accum=accum)
    ref, ref_lse = attention_ref(q, k, v, is_causal=causal, return_lse=True)
    stats = mma.check_exact(metrics, out, ref, FP8)
    print(f"sm89 {accum} {kind} causal={causal} vs float64: {metrics.fmt(stats)}")
    mma.check_lse(lse, ref_lse, atol=5e-2 if kind == "randn" else 0.1, what="lse vs float64")
    mma.check_tight(metrics, out, reference(q, k, v, causal=causal), FP8)


def test_without_smoothing_and_without_lse(metrics, mma):
    q, k, v = (mma.make(1, 2, 200, 64, "HND", torch.float16, s) for s in (19, 20, 21))
    out, lse = run_kernel(q, k, v, causal=False, smooth_k=False)
    assert lse is None
    mma.check_tight(metrics, out, reference(q, k, v, causal=False, smooth_k=False), FP8)


def test_out_layout_follows_q(mma):
    q, k, v = (mma.make(1, 2, 70, 64, "HND", torch.float16, s) for s in (22, 23, 24))
    a, _ = run_kernel(q, k, v, causal=False)
    c, _ = run_kernel(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, causal=False)
    assert a.is_contiguous() and c.transpose(1, 2).is_contiguous()
    assert torch.equal(a, c)


def test_rejects_inputs_it_cannot_take(mma):
    q, k, v = (mma.make(1, 2, 200, 64, "HND", torch.float16, s) for s in (28, 29, 30))
    km = k.mean(dim=2, dtype=torch.float32)
    vmax = torch.linalg.vector_norm(v, ord=math.inf, dim=2, dtype=torch.float32)
    qq, qs, _ = ops.quant_q_per_token(q, km, 0.125, 0.125 * LOG2E / 127, 64, 1, False)
    vt = ops.quant_v_fp8(v, vmax, 64, 208, True)
    vs = vmax / 448
    kq, ks = ops.quant_k_per_block(k, km, KEY_BLOCK, 64)

    def attend(kq=kq, ks=ks, vt=vt, vs=vs, out_dtype=torch.float16, pv_accum="fp32+fp32"):
        return ops.qk_int8_sv_f8_attn_sm89(
            qq, kq, vt, qs, ks, vs, None, False, False, out_dtype, False, pv_accum
        )

    attend()  # the valid call
    kq128, ks128 = ops.quant_k_per_block(k, km, 128, 64)  # one scale per 128 keys: the sm90 layout
    with pytest.raises(RuntimeError, match="k_scale"):
        attend(kq=kq128, ks=ks128)
    with pytest.raises(RuntimeError, match="n_pad"):
        attend(vt=vt[..., :200])
    with pytest.raises(RuntimeError, match="v_scale"):
        attend(vs=vs[..., :60])
    with pytest.raises(RuntimeError, match="vt_fp8"):
        attend(vt=vt.float())
    with pytest.raises(RuntimeError, match="out_dtype"):
        attend(out_dtype=torch.float32)
    with pytest.raises(RuntimeError, match="pv_accum must be 'fp32', 'fp32\\+fp32' or 'fp32\\+fp16'"):
        attend(pv_accum="fp16")


def test_fake_implementation_matches(mma):
    assert cuda_ops.registered(SM89_MODULE), cuda_ops.unavailable_reason(SM89_MODULE)
    q, k, v = (mma.make(1, 4, 130, 96, "NHD", torch.bfloat16, s) for s in (31, 32, 33))
    km = k.mean(dim=2, dtype=torch.float32)
    vmax = torch.linalg.vector_norm(v, ord=math.inf, dim=2, dtype=torch.float32)
    qq, qs, corr = ops.quant_q_per_token(q, km, 0.1, 0.1 * LOG2E / 127, 128, 1, True)
    kq, ks = ops.quant_k_per_block(k, km, KEY_BLOCK, 128)
    vt = ops.quant_v_fp8(v, vmax, 128, 144, True)
    args = (qq, kq, vt, qs, ks, vmax / 448, corr, True, True, torch.bfloat16, True, "fp32+fp32")
    # opcheck's test_schema compares inputs with arithmetic that float8 tensors do not support: the
    # fake tensor check is what counts.
    torch.library.opcheck(ops.qk_int8_sv_f8_attn_sm89.default, args, test_utils=("test_faketensor",))
    torch.library.opcheck(ops.quant_v_fp8.default, (v, vmax, 128, 144, True), test_utils=("test_faketensor",))
    torch.library.opcheck(
        ops.quant_q_per_token.default,
        (q, km, 0.1, 0.1 * LOG2E / 127, 128, 1, True),
        test_utils=("test_faketensor",),
    )


def test_launcher_compiles_without_graph_breaks(metrics, mma):
    """torch.compile(fullgraph=True) traces the launcher: quantization ops and kernel have fakes."""
    q, k, v = (mma.make(1, 4, 300, 64, "NHD", torch.bfloat16, s) for s in (34, 35, 36))

    def fn(q, k, v):
        return run_kernel(q, k, v, causal=True, return_lse=True)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    (a, la), (b, lb) = compiled(q, k, v), fn(q, k, v)
    assert metrics.cosine(a, b) >= 0.99999
    torch.testing.assert_close(la, lb)


# --------------------------------------------------------------------------------------------------
# The public API: sageattn_qk_int8_pv_fp8_cuda


@pytest.mark.parametrize("accum", [p for p in ACCUM_PARAMS if p.id != "fp32"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_public_fp8_cuda_variant(metrics, mma, accum, layout):
    q = mma.make(2, 8, 777, 128, layout, torch.bfloat16, 40)
    k, v = (mma.make(2, 2, 777, 128, layout, torch.bfloat16, s) for s in (41, 42))
    as_layout = (lambda x: x) if layout == "HND" else (lambda x: x.transpose(1, 2))
    out, lse = sa.sageattn_qk_int8_pv_fp8_cuda(
        as_layout(q), as_layout(k), as_layout(v), tensor_layout=layout, is_causal=True, pv_accum_dtype=accum,
        return_lse=True,
    )  # fmt: skip
    assert out.shape == as_layout(q).shape and out.dtype == torch.bfloat16
    ref, ref_lse = reference(q, k, v, causal=True, return_lse=True)
    mma.check_tight(metrics, as_layout(out), ref, FP8)
    mma.check_lse(lse, ref_lse, atol=2e-4)


def test_public_fp8_cuda_options(mma):
    q, k, v = (mma.make(1, 4, 300, 64, "HND", torch.float16, s) for s in (43, 44, 45))
    a = sa.sageattn_qk_int8_pv_fp8_cuda(q, k, v, qk_quant_gran="per_warp", pv_accum_dtype="fp32+fp32")
    b = sa.sageattn_qk_int8_pv_fp8_cuda(
        q, k, v, qk_quant_gran="per_thread", pv_accum_dtype="fp32+fp32", smooth_v=True
    )
    assert torch.equal(a, b), "qk_quant_gran and smooth_v are accepted for compatibility and change nothing"
    with pytest.raises(ValueError, match=r"pv_accum_dtype='fp16' is not supported here; valid values"):
        sa.sageattn_qk_int8_pv_fp8_cuda(q, k, v, pv_accum_dtype="fp16")
