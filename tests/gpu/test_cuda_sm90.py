"""The sm_90a CUDA attention kernel (csrc/sm90, op sageattention::qk_int8_sv_f8_attn_sm90) against
the simulated-quantization reference (tightly) and float64 attention (loosely), and the permuted FP8
V quantization it reads (quant_v_fp8(..., permute_keys=True)) bit for bit.

Inputs are made by sageattention.cuda_sm90.attention_sm90 with the compiled fused quantization ops,
exactly as the kernel is fed: Q INT8 per token, K minus its mean INT8 per block of 128 keys, V FP8
e4m3 per channel, transposed, keys permuted within groups of 16.

Bounds. Against sage_ref(pv=FP8, block_m=1, block_n=128, rowsum="rounded"), conftest's
TIGHT_BOUNDS[FP8]: cosine >= 0.9999 and max|out - ref| <= 0.07 * max|ref|. The kernel and the
reference quantize identically; what is left is float32 summation order, exp2 (ex2.approx; the
kernel computes 448 P as exp2(x * scale + (log2 448 - max)), one FFMA where the reference rounds x *
scale, subtracts the max and multiplies by 448: a few float32 ulps of the exponent; for 1/8 of the
scores a polynomial on the FMA pipe, relative error 7.5e-5), the FP8 MMA's internal accumulation
within one 128-key block (~22 mantissa bits) and the fp16/bf16 rounding of the output (2^-8
relative). Any of the first three can move P * 448 across an e4m3 rounding boundary now and then,
and with 3 mantissa bits such a flip changes that element by up to 1/16: visible in rows with few
keys (short or causal rows), which is why the max-error bound is 0.07 and not 0.01. A wrong tile,
swizzle, mask, key permutation or scale gives errors of order max|ref| and cannot pass. The LSE
uses the reference's row sum (of the rounded P, as the tensor cores add it in the kernel:
rowsum="rounded"), so e4m3 rounding flips reach it too: atol LSE_ATOL.
Against float64 attention_ref (DESIGN.md protocol, b=1 h=8 n=4096 d=128), conftest's
EXACT_BOUNDS[FP8]: cosine >= 0.9992 and relative L1 <= 0.04 (the Triton FP8 path measures 0.99926 /
0.0384 on randn, whose quantization this kernel shares).

The kernel has three schedules (csrc/sm90/attn.h, Sm90Schedule; SAGEATTN_SM90_SCHEDULE picks one at
each launch, default pingpong). They run the same instructions on the same data in different
orders, so their outputs must agree bit for bit: a difference means a race (a register or tile read
before its wgmma or TMA copy completed, or overwritten while one still reads it).

Inputs and checks come from conftest's ``mma`` fixture. Its failure messages say where the error
sits in 128-row CTAs of 8 warps x 16 rows, which is this kernel's tiling too (two consumer
warpgroups of 4 warps; warps 0-3 are the first warpgroup): batch, head, row, channel of the worst
element, the worst heads, CTAs, warps and channels, where NaNs are. That is usually enough to tell a
mask, a swizzle, a fragment layout or an unwritten tile apart.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from sageattention.quant import LOG2E, PVDtype
from sageattention.reference import attention_ref, permute_keys_sm90, quantize_v_fp8_ref, sage_ref

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
for _module in ("sageattention._qattn_sm90", "sageattention._fused"):
    try:
        importlib.import_module(_module)
    except ImportError as exc:
        pytest.skip(f"{_module} is not built: {exc}", allow_module_level=True)
_CAPABILITY = torch.cuda.get_device_capability()
if _CAPABILITY != (9, 0):
    pytest.skip(f"needs an sm_90 GPU, this is sm_{_CAPABILITY[0]}{_CAPABILITY[1]}", allow_module_level=True)

from sageattention import cuda_ops  # noqa: E402  (registers the fake implementations)
from sageattention.cuda_sm90 import KEY_BLOCK, attention_sm90  # noqa: E402

ops = torch.ops.sageattention
SM90_MODULE = "sageattention._qattn_sm90"


#: LSE against sage_ref(rowsum="rounded"): the row sum adds P as e4m3, and an element whose 448 P sits
#: next to an e4m3 rounding boundary can round the other way in the kernel (ex2.approx's ulps, the
#: FMA-pipe exp2's 7.5e-5): the sum then moves by up to 1/16 of that element's share of the row. Seen:
#: at most 2.5e-3 over the tests' rows (H100, 2026-11-23); the other suites' LSE bound.
LSE_ATOL = 1e-2


def run_kernel(q, k, v, *, causal, return_lse=False, smooth_k=True):
    return attention_sm90(
        q, k, v, is_causal=causal, sm_scale=q.shape[-1] ** -0.5, smooth_k=smooth_k, return_lse=return_lse
    )


def reference(q, k, v, *, causal, return_lse=False, smooth_k=True):
    return sage_ref(
        q, k, v, is_causal=causal, sm_scale=q.shape[-1] ** -0.5, pv=PVDtype.FP8, smooth_k=smooth_k, block_m=1,
        block_n=KEY_BLOCK, return_lse=return_lse, rowsum="rounded",
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------
# FP8 V with permuted keys


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n,d", [(1, 128), (17, 64), (113, 72), (1000, 128), (4095, 40)])
@pytest.mark.parametrize("pad_to", [16, 128])
def test_quant_v_fp8_permute_keys_is_bit_exact(dtype, n, d, pad_to, mma):
    v = mma.make(2, 3, n, d, "NHD", dtype, 1, scale=3.0)
    vmax = torch.linalg.vector_norm(v, ord=math.inf, dim=2, dtype=torch.float32)
    d_pad = 64 if d <= 64 else 128
    n_pad = -(-n // pad_to) * pad_to
    nan_bytes = ((2, 3, d_pad, n_pad), torch.uint8)  # 0xFF is NaN in e4m3fn: unwritten slots show
    blocks = [torch.full(nan_bytes[0], 255, dtype=torch.uint8, device="cuda")]
    del blocks
    plain = ops.quant_v_fp8(v, vmax, d_pad, n_pad)  # the old 4-argument call: no permutation
    blocks = [torch.full(nan_bytes[0], 255, dtype=torch.uint8, device="cuda")]
    del blocks
    permuted = ops.quant_v_fp8(v, vmax, d_pad, n_pad, True)
    ref_v, _ = quantize_v_fp8_ref(v)
    assert torch.equal(plain[:, :, :d, :n].float().transpose(-1, -2), ref_v)
    raw = plain.view(torch.uint8)
    assert not raw[..., n:].any(), "tokens past N must be zeros"
    assert not raw[:, :, d:].any(), "channels past D must be zeros"
    expected = permute_keys_sm90(plain).view(torch.uint8)
    got = permuted.view(torch.uint8)
    if not torch.equal(got, expected):
        bad = (got != expected).nonzero()
        raise AssertionError(f"{len(bad)} bytes differ; first (b, h, channel, slot): {bad[:8].tolist()}")


def test_quant_v_fp8_permute_keys_needs_groups_of_16(mma):
    v = mma.make(1, 1, 20, 64, "HND", torch.float16, 2)
    vmax = torch.linalg.vector_norm(v, ord=math.inf, dim=2, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        ops.quant_v_fp8(v, vmax, 64, 24, True)


# --------------------------------------------------------------------------------------------------
# Attention


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n", [1, 17, 113, 1000, 4095])
@pytest.mark.parametrize("d", [64, 128])
def test_matches_sage_ref(metrics, layout, causal, n, d, mma):
    b, hq, hkv = 2, 8, 2  # GQA: 4 query heads per KV head
    dtype = torch.bfloat16 if n % 2 else torch.float16
    q, k, v = (mma.make(b, h, n, d, layout, dtype, seed) for h, seed in ((hq, 1), (hkv, 2), (hkv, 3)))
    k = k + 2.0  # a common offset that smooth-K removes
    mma.poison_allocator(((b, hq, n, d), dtype), ((b, hq, n), torch.float32))
    out, lse = run_kernel(q, k, v, causal=causal, return_lse=True)
    assert out.shape == q.shape and out.dtype == dtype and out.stride() == torch.empty_like(q).stride()
    ref, ref_lse = reference(q, k, v, causal=causal, return_lse=True)
    mma.check_tight(metrics, out, ref, PVDtype.FP8)
    mma.check_lse(lse, ref_lse, atol=LSE_ATOL)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "nq,nk", [(100, 300), (300, 100), (129, 64), (64, 129), (1, 1000), (1000, 1), (17, 4095), (4095, 113)]
)
def test_different_query_and_key_lengths(metrics, causal, nq, nk, mma):
    q = mma.make(1, 4, nq, 128, "HND", torch.float16, 4)
    k, v = mma.make(1, 4, nk, 128, "HND", torch.float16, 5), mma.make(1, 4, nk, 128, "HND", torch.float16, 6)
    mma.poison_allocator(((1, 4, nq, 128), torch.float16), ((1, 4, nq), torch.float32))
    out, lse = run_kernel(q, k, v, causal=causal, return_lse=True)
    ref, ref_lse = reference(q, k, v, causal=causal, return_lse=True)
    mma.check_tight(metrics, out, ref, PVDtype.FP8)
    mma.check_lse(lse, ref_lse, atol=LSE_ATOL)


@pytest.mark.parametrize("d", [40, 72, 96])
def test_head_dims_below_the_tile(metrics, d, mma):
    q, k, v = (mma.make(1, 4, 333, d, "NHD", torch.bfloat16, s) for s in (7, 8, 9))
    mma.poison_allocator(((1, 4, 333, d), torch.bfloat16))
    out, _ = run_kernel(q, k, v, causal=True)
    assert out.shape == q.shape
    mma.check_tight(metrics, out, reference(q, k, v, causal=True), PVDtype.FP8)


@pytest.mark.parametrize("kv_group", [1, 8])
@pytest.mark.parametrize("d", [64, 128])
def test_gqa_groups(metrics, kv_group, d, mma):
    q = mma.make(1, 8, 500, d, "HND", torch.float16, 10)
    hkv = 8 // kv_group
    k, v = (
        mma.make(1, hkv, 500, d, "HND", torch.float16, 11),
        mma.make(1, hkv, 500, d, "HND", torch.float16, 12),
    )
    out, _ = run_kernel(q, k, v, causal=False)
    mma.check_tight(metrics, out, reference(q, k, v, causal=False), PVDtype.FP8)


@pytest.mark.parametrize("kind", ["randn", "outlier"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_against_float64(metrics, kind, causal, mma):
    """The accuracy promised to users (DESIGN.md protocol)."""
    q, k, v = mma.protocol_inputs(kind, 13)
    out, lse = run_kernel(q, k, v, causal=causal, return_lse=True)
    ref, ref_lse = attention_ref(q, k, v, is_causal=causal, return_lse=True)
    stats = mma.check_exact(metrics, out, ref, PVDtype.FP8)
    print(f"sm90 {kind} causal={causal} vs float64: {metrics.fmt(stats)}")
    # The LSE carries the INT8 error of the scores (FP8 P·V does not enter it): a few 1e-3 for most
    # rows; the first causal rows see one or two keys, so their LSE is one score and keeps its full
    # INT8 error, which grows with |q| |k| (H100: up to 0.032 on randn, 0.067 on the outlier set). A
    # masking or scaling bug moves an LSE by O(1) (log 2 for a key counted twice).
    mma.check_lse(lse, ref_lse, atol=5e-2 if kind == "randn" else 0.1, what="lse vs float64")
    mma.check_tight(metrics, out, reference(q, k, v, causal=causal), PVDtype.FP8, what="vs sage_ref")


SCHEDULES = ("serial", "overlap", "pingpong")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("nq,nk", [(64, 100), (200, 256), (300, 260), (1000, 1000), (129, 4095)])
def test_schedules_agree_bit_for_bit(metrics, monkeypatch, causal, d, nq, nk, mma):
    """1, 2, 3, 8 and 32 key blocks (the overlapped schedules peel the last step off their loop;
    ping-pong's turn counting depends on the block count), GQA, both output dtypes."""
    dtype = torch.bfloat16 if nk % 2 == 0 else torch.float16
    q = mma.make(2, 4, nq, d, "NHD", dtype, 40)
    k, v = mma.make(2, 2, nk, d, "NHD", dtype, 41), mma.make(2, 2, nk, d, "NHD", dtype, 42)
    results = {}
    for schedule in SCHEDULES:
        monkeypatch.setenv("SAGEATTN_SM90_SCHEDULE", schedule)
        mma.poison_allocator(((2, 4, nq, d), dtype), ((2, 4, nq), torch.float32))
        results[schedule] = run_kernel(q, k, v, causal=causal, return_lse=True)
    out, lse = results["serial"]
    mma.check_tight(metrics, out, reference(q, k, v, causal=causal), PVDtype.FP8)
    for schedule in SCHEDULES[1:]:
        other, other_lse = results[schedule]
        if not torch.equal(other, out):
            raise AssertionError(f"{schedule} differs from serial\n{mma.where_it_differs(other, out)}")
        assert torch.equal(other_lse, lse), f"{schedule}: LSE differs from serial"


def test_unknown_schedule_is_rejected(monkeypatch, mma):
    q, k, v = (mma.make(1, 2, 70, 64, "HND", torch.float16, s) for s in (43, 44, 45))
    monkeypatch.setenv("SAGEATTN_SM90_SCHEDULE", "fastest")
    with pytest.raises(RuntimeError, match="invalid argument"):
        run_kernel(q, k, v, causal=False)


def test_without_smoothing_and_without_lse(metrics, mma):
    q, k, v = (mma.make(1, 2, 200, 64, "HND", torch.float16, s) for s in (19, 20, 21))
    out, lse = run_kernel(q, k, v, causal=False, smooth_k=False)
    assert lse is None
    mma.check_tight(metrics, out, reference(q, k, v, causal=False, smooth_k=False), PVDtype.FP8)


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

    def attend(kq=kq, ks=ks, vt=vt, vs=vs, out_dtype=torch.float16):
        return ops.qk_int8_sv_f8_attn_sm90(qq, kq, vt, qs, ks, vs, None, False, False, out_dtype, False)

    attend()  # the valid call
    kq64, ks64 = ops.quant_k_per_block(k, km, 64, 64)  # one scale per 64 keys: the sm80 layout
    with pytest.raises(RuntimeError, match="k_scale"):
        attend(kq=kq64, ks=ks64)
    with pytest.raises(RuntimeError, match="n_pad"):
        attend(vt=vt[..., :200])
    with pytest.raises(RuntimeError, match="v_scale"):
        attend(vs=vs[..., :60])
    with pytest.raises(RuntimeError, match="vt_fp8"):
        attend(vt=vt.float())
    with pytest.raises(RuntimeError, match="out_dtype"):
        attend(out_dtype=torch.float32)


def test_fake_implementation_matches(mma):
    assert cuda_ops.registered(SM90_MODULE), cuda_ops.unavailable_reason(SM90_MODULE)
    q, k, v = (mma.make(1, 4, 130, 96, "NHD", torch.bfloat16, s) for s in (31, 32, 33))
    km = k.mean(dim=2, dtype=torch.float32)
    vmax = torch.linalg.vector_norm(v, ord=math.inf, dim=2, dtype=torch.float32)
    qq, qs, corr = ops.quant_q_per_token(q, km, 0.1, 0.1 * LOG2E / 127, 128, 1, True)
    kq, ks = ops.quant_k_per_block(k, km, KEY_BLOCK, 128)
    vt = ops.quant_v_fp8(v, vmax, 128, 144, True)
    args = (qq, kq, vt, qs, ks, vmax / 448, corr, True, True, torch.bfloat16, True)
    # opcheck's test_schema compares inputs before and after with arithmetic that float8 tensors do
    # not support ("mul_cuda" not implemented for Float8_e4m3fn): the fake tensor check is what counts.
    torch.library.opcheck(ops.qk_int8_sv_f8_attn_sm90.default, args, test_utils=("test_faketensor",))
