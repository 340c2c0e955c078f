"""The compiled CUDA attention kernels against the simulated-quantization reference (tightly) and
float64 attention (loosely), their ops' argument checks and fake implementations, and the public API
variants that run them:

* cuda_sm80: csrc/sm80, op sageattention::qk_int8_sv_f16_attn, sageattn_qk_int8_pv_fp16_cuda; runs on
  every arch >= 8.0;
* cuda_sm89: csrc/sm89, op sageattention::qk_int8_sv_f8_attn_sm89, sageattn_qk_int8_pv_fp8_cuda; runs
  on every arch >= 8.9 (on sm90 mma.sync e4m3 runs as FP16 HMMA, exactly);
* cuda_sm90: csrc/sm90, op sageattention::qk_int8_sv_f8_attn_sm90; sm90 only.

Each test runs for the backends it applies to (KERNELS below holds what differs between them), through
conftest's ``sage_backend`` fixture narrowed by name, which skips a backend where it cannot run (GPU
arch, extension or fused quantization ops not built). An H100/H200 runs all three.

Inputs are quantized with the compiled fused ops, exactly as each kernel is fed: Q INT8 per token; K
minus its mean, INT8 per block of the kernel's key step (64 keys for sm80 and sm89, 128 for sm90);
for sm80 as two INT8 digits (quant_k_per_block(..., residual=True), the production path of
sageattention.cuda_sm80) or one (the single-level form the op still takes), V FP16; for sm89 and sm90
V FP8 e4m3 per channel, transposed, keys permuted within groups of 16 (mma.sync m16n8k32 fragments
are laid out like wgmma's). The sm80 op is called directly (its K digits and output layout are
arguments), the FP8 kernels through their launchers (sageattention.cuda_sm89.attention_sm89,
sageattention.cuda_sm90.attention_sm90).

P·V accumulations. sm80: "fp32", or "fp16+fp32" (FP16 inside a 64-key block added into FP32). sm89:
"fp32" (every MMA into the running output), "fp32+fp32" (fresh FP32 per 64-key block), "fp32+fp16"
(FP16 per block; V quantized with amax * 256 so no block sum overflows). The last changes V's e4m3
digits only below 4 / 448 of a channel's amax, and rounds each block sum to FP16.

Bounds. Against sage_ref with each kernel's quantization (SageBackend.reference_options: block_m=1,
block_n the key step, k_residual for sm80's two digits, rowsum="rounded" for sm90), conftest's
TIGHT_BOUNDS: FP16 P·V cosine >= 0.99999 and max|out - ref| <= 0.02 max|ref|, FP8 P·V cosine >=
0.9999 and max|out - ref| <= 0.07 max|ref|. Kernel and reference quantize identically (sm80's
two-level score is the exact integer 254 q.k1 + q.k2 on both sides); what is left is float32
summation order, exp2 (ex2.approx; sm90 computes 448 P as exp2(x * scale + (log2 448 - max)), one
FFMA where the reference rounds x * scale, subtracts the max and multiplies by 448: a few float32 ulps
of the exponent), FP16 rounding of block sums (sm89 "fp32+fp16"), the FP8 MMA's internal
accumulation within one 128-key block (sm90, ~22 mantissa bits) and the fp16/bf16 rounding of the
output (2^-8 relative). Any of
them can move P * 448 across an e4m3 rounding boundary now and then, and with 3 mantissa bits such a
flip changes that element by up to 1/16: visible in rows with few keys (short or causal rows), which
is why the FP8 max-error bound is 0.07 and not 0.01. A wrong tile, swizzle, fragment, key
permutation, mask or scale gives errors of order max|ref| and cannot pass. The LSE against sage_ref:
``lse_atol`` of the table (sm80 and sm89 share the reference's arithmetic; sm90's row sum adds the
rounded P, as its tensor cores do, so e4m3 rounding flips reach it).

Against float64 attention_ref (README's accuracy protocol, b=1 h=8 n=4096 d=128, randn and outlier inputs):
conftest's EXACT_BOUNDS, FP16 P·V cosine >= 0.9999 and relative L1 <= 0.015, FP8 P·V cosine >= 0.9992
and relative L1 <= 0.04 (the Triton FP8 path measures 0.99926 / 0.0384 on randn, whose quantization
sm90 shares). sm80 with single-level K misses the L1 bound on the outlier set (~0.020), two-level K
meets it (~0.012 on the Triton path, which shares this quantization). The LSE within 5e-2 (randn)
and 0.1 (outliers: the first causal rows see one key, so their LSE is one score with the full INT8
error of Q, twice as large with Q x2).

The sm90 kernel's consumer warpgroups (3 at d_pad 128, 4 at 64, 64 rows each) stop at their own
last key block in causal attention, so a CTA's warpgroups can run different block counts: the
block-count test covers 1, 2, 3, 8 and 32 blocks, causal and not.

Inputs and checks come from conftest's ``mma`` fixture. Its failure messages say where the error
sits in 128-row tiles of 8 warps x 16 rows, the tiling of the sm80 and sm89 kernels (sm90's CTAs
hold 192 or 256 rows, 64 per warpgroup of 4 warps, so its warps 0-3 and 4-7 are its first two
warpgroups' rows): batch, head, row, channel of the worst element, the worst heads, CTAs, warps and
channels, where NaNs are. That is usually enough to tell a mask, a swizzle, a fragment layout or an
unwritten tile apart.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from sageattention import cuda_common, cuda_ops, cuda_sm80, cuda_sm89, cuda_sm90  # cuda_ops registers fakes
from sageattention.quant import LOG2E, PVDtype
from sageattention.reference import attention_ref, permute_keys_sm90, quantize_v_fp8_ref, sage_ref

pytestmark = pytest.mark.gpu

ops = torch.ops.sageattention
SM80, SM89, SM90 = "cuda_sm80", "cuda_sm89", "cuda_sm90"


def _run_sm80(q, k, v, *, is_causal, sm_scale, smooth_k, return_lse, pv_accum="fp32", out_nhd=None,
              residual=True):  # fmt: skip
    """Quantize HND views with the fused ops and run the sm80 op: (out, lse or None). ``residual``:
    two K digits (the production path) or one; ``out_nhd``: the output layout (None: like q)."""
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[-1]
    d_pad = 64 if d <= 64 else 128
    km = k.mean(dim=2, dtype=torch.float32) if smooth_k else None
    with_corr = return_lse and smooth_k
    qq, qs, corr = ops.quant_q_per_token(q, km, sm_scale, sm_scale * LOG2E / 127, d_pad, hq // hkv, with_corr)
    quantized_k = ops.quant_k_per_block(k, km, cuda_sm80.KEY_BLOCK, d_pad, residual)
    kq, ks = quantized_k[0], quantized_k[1]
    kr = quantized_k[2] if residual else None
    vh = v if v.dtype == torch.float16 else v.to(torch.float16)
    if out_nhd is None:
        out_nhd = q.stride(1) < q.stride(2)
    out, lse = ops.qk_int8_sv_f16_attn(
        qq, kq, vh, qs, ks, corr if with_corr else None, is_causal, return_lse, q.dtype, out_nhd, pv_accum, kr
    )
    return out, (lse if return_lse else None)


@dataclass(frozen=True)
class Kernel:
    """What the tests need to know of one compiled kernel beyond conftest's SageBackend."""

    #: the kernel on HND views, fed by the fused quantization ops: (q, k, v, *, is_causal, sm_scale,
    #: smooth_k, return_lse, pv_accum=...) -> (out, lse or None)
    run: Callable[..., tuple]
    #: the package's launcher (the arguments of ``run``, bar cuda_sm80's residual and out_nhd)
    launcher: Callable[..., tuple]
    #: the launcher module's KEY_BLOCK (conftest's SageBackend.key_block must agree)
    key_block: int
    #: the P·V precision (conftest's SageBackend.pv must agree)
    pv: PVDtype
    #: the attention op in torch.ops.sageattention and the extension module that holds it
    op: str
    extension: str
    #: LSE against sage_ref with the kernel's reference options
    lse_atol: float
    #: the op's P·V accumulations (its pv_accum argument), its default first; () for none
    pv_accums: tuple[str, ...] = ()
    #: what the op says of a pv_accum it does not have (a regex)
    op_accum_error: str | None = None
    #: accumulations checked against float64 (None: the launcher's default)
    float64_accums: tuple[str | None, ...] = (None,)
    #: pv_accum_dtype values of the kernel's public variant (the first is its options test's); ()
    #: when the public variant is not tested here
    public_accums: tuple[str, ...] = ()
    #: what the public variant says when given pv_accum_dtype="fp16" (a regex)
    public_accum_error: str | None = None
    #: whether a CTA's warpgroups run their own causal block counts (the block-count test)
    per_warpgroup_blocks: bool = False


KERNELS = {
    SM80: Kernel(
        run=_run_sm80,
        launcher=cuda_sm80.attention_sm80,
        key_block=cuda_sm80.KEY_BLOCK,
        pv=PVDtype.FP16,
        op="qk_int8_sv_f16_attn",
        extension="sageattention._qattn_sm80",
        lse_atol=2e-4,
        pv_accums=("fp32", "fp16+fp32"),
        op_accum_error="pv_accum",
        public_accums=("fp32", "fp16+fp32"),
        public_accum_error=r"pv_accum_dtype='fp16' is not supported here; valid values: fp32, fp16\+fp32",
    ),
    SM89: Kernel(
        run=cuda_sm89.attention_sm89,
        launcher=cuda_sm89.attention_sm89,
        key_block=cuda_sm89.KEY_BLOCK,
        pv=PVDtype.FP8,
        op="qk_int8_sv_f8_attn_sm89",
        extension="sageattention._qattn_sm89",
        lse_atol=2e-4,
        pv_accums=("fp32+fp32", "fp32+fp16", "fp32"),
        op_accum_error="pv_accum must be 'fp32', 'fp32\\+fp32' or 'fp32\\+fp16'",
        float64_accums=("fp32+fp32", "fp32+fp16"),
        public_accums=("fp32+fp32", "fp32+fp16"),
        public_accum_error=r"pv_accum_dtype='fp16' is not supported here; valid values",
    ),
    SM90: Kernel(
        run=cuda_sm90.attention_sm90,
        launcher=cuda_sm90.attention_sm90,
        key_block=cuda_sm90.KEY_BLOCK,
        pv=PVDtype.FP8,
        op="qk_int8_sv_f8_attn_sm90",
        extension="sageattention._qattn_sm90",
        # The row sum adds P as e4m3 (rowsum="rounded"), and an element whose 448 P sits next to an e4m3
        # rounding boundary can round the other way in the kernel (ex2.approx's ulps): the sum then
        # moves by up to 1/16 of that element's share of the row. Seen:
        # at most 2.5e-3 over the tests' rows (H100, 2026-11-23); the other suites' LSE bound.
        lse_atol=1e-2,
        per_warpgroup_blocks=True,
    ),
}
FP16_KERNELS = tuple(name for name, kernel in KERNELS.items() if kernel.pv is PVDtype.FP16)
FP8_KERNELS = tuple(name for name, kernel in KERNELS.items() if kernel.pv is PVDtype.FP8)


def on(*names):
    """Run a test for these backends (conftest's ``sage_backend``, narrowed by name)."""
    return pytest.mark.parametrize("sage_backend", names, indirect=True)


def on_each_accum(field):
    """Run a test for each (backend, accum) of the table's ``field`` (a tuple of accumulations)."""
    cases = [
        pytest.param(name, accum, id=name if accum is None else f"{name}-{accum}")
        for name, kernel in KERNELS.items()
        for accum in getattr(kernel, field)
    ]
    return pytest.mark.parametrize("sage_backend,accum", cases, indirect=["sage_backend"])


def supporting(field):
    """The backends whose table entry has ``field`` (not empty)."""
    return tuple(name for name, kernel in KERNELS.items() if getattr(kernel, field))


def skip_unless_built(accum):
    """sm89's "fp32+fp16" needs the FP16-accumulating FP8 MMA, which needs CUDA >= 12.8 at build time."""
    if accum == "fp32+fp16" and not cuda_sm89.fp16_accum_available():
        pytest.skip("built with CUDA < 12.8")


def run_kernel(backend, q, k, v, *, causal, return_lse=False, smooth_k=True, **options):
    """``backend``'s kernel on HND views with sm_scale = d^-0.5: (out, lse or None). ``options``: the
    kernel's own (pv_accum; for cuda_sm80 also residual and out_nhd)."""
    return KERNELS[backend.name].run(
        q, k, v, is_causal=causal, sm_scale=q.shape[-1] ** -0.5, smooth_k=smooth_k, return_lse=return_lse,
        **options,
    )  # fmt: skip


def reference(backend, q, k, v, *, causal, return_lse=False, smooth_k=True, **options):
    """sage_ref with ``backend``'s quantization (SageBackend.reference_options, the sm_90a kernel's
    split tiles included); ``options`` replace single ones (k_residual=False: one K digit)."""
    shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    options = {**backend.reference_options(q.shape[-1], shape=shape, causal=causal), **options}
    return sage_ref(
        q, k, v, is_causal=causal, sm_scale=q.shape[-1] ** -0.5, smooth_k=smooth_k, return_lse=return_lse,
        **options,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Every kernel


@on(*KERNELS)
def test_key_block_is_the_kernel_step(sage_backend):
    """The launcher's key block and the P·V precision are those conftest's reference options use."""
    kernel = KERNELS[sage_backend.name]
    assert kernel.key_block == sage_backend.key_block
    assert kernel.pv is sage_backend.pv


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n", [1, 17, 113, 1000, 4095])
@pytest.mark.parametrize("d", [64, 128])
@on(*KERNELS)
def test_matches_sage_ref(sage_backend, metrics, mma, layout, causal, n, d):
    """The production path (cuda_sm80: two-level K)."""
    b, hq, hkv = 2, 8, 2  # GQA: 4 query heads per KV head
    dtype = torch.bfloat16 if n % 2 else torch.float16
    q, k, v = (mma.make(b, h, n, d, layout, dtype, seed) for h, seed in ((hq, 1), (hkv, 2), (hkv, 3)))
    k = k + 2.0  # a common offset that smooth-K removes
    mma.poison_allocator(((b, hq, n, d), dtype), ((b, hq, n), torch.float32))
    out, lse = run_kernel(sage_backend, q, k, v, causal=causal, return_lse=True)
    assert out.shape == q.shape and out.dtype == dtype and out.stride() == torch.empty_like(q).stride()
    ref, ref_lse = reference(sage_backend, q, k, v, causal=causal, return_lse=True)
    mma.check_tight(metrics, out, ref, sage_backend.pv)
    mma.check_lse(lse, ref_lse, atol=KERNELS[sage_backend.name].lse_atol)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "nq,nk", [(100, 300), (300, 100), (129, 64), (64, 129), (1, 1000), (1000, 1), (17, 4095), (4095, 113)]
)
@on(*KERNELS)
def test_different_query_and_key_lengths(sage_backend, metrics, mma, causal, nq, nk):
    q = mma.make(1, 4, nq, 128, "HND", torch.float16, 4)
    k, v = mma.make(1, 4, nk, 128, "HND", torch.float16, 5), mma.make(1, 4, nk, 128, "HND", torch.float16, 6)
    mma.poison_allocator(((1, 4, nq, 128), torch.float16), ((1, 4, nq), torch.float32))
    out, lse = run_kernel(sage_backend, q, k, v, causal=causal, return_lse=True)
    ref, ref_lse = reference(sage_backend, q, k, v, causal=causal, return_lse=True)
    mma.check_tight(metrics, out, ref, sage_backend.pv)
    mma.check_lse(lse, ref_lse, atol=KERNELS[sage_backend.name].lse_atol)


@pytest.mark.parametrize("d", [40, 72, 96])
@on(*KERNELS)
def test_head_dims_below_the_tile(sage_backend, metrics, mma, d):
    q, k, v = (mma.make(1, 4, 333, d, "NHD", torch.bfloat16, s) for s in (7, 8, 9))
    mma.poison_allocator(((1, 4, 333, d), torch.bfloat16))
    out, _ = run_kernel(sage_backend, q, k, v, causal=True)
    assert out.shape == q.shape
    mma.check_tight(metrics, out, reference(sage_backend, q, k, v, causal=True), sage_backend.pv)


@pytest.mark.parametrize("kv_group", [1, 8])
@pytest.mark.parametrize("d", [64, 128])
@on(*KERNELS)
def test_gqa_groups(sage_backend, metrics, mma, kv_group, d):
    q = mma.make(1, 8, 500, d, "HND", torch.float16, 10)
    hkv = 8 // kv_group
    k, v = (
        mma.make(1, hkv, 500, d, "HND", torch.float16, 11),
        mma.make(1, hkv, 500, d, "HND", torch.float16, 12),
    )
    out, _ = run_kernel(sage_backend, q, k, v, causal=False)
    mma.check_tight(metrics, out, reference(sage_backend, q, k, v, causal=False), sage_backend.pv)


@pytest.mark.parametrize("kind", ["randn", "outlier"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@on_each_accum("float64_accums")
def test_against_float64(sage_backend, accum, metrics, mma, kind, causal):
    """The accuracy promised to users (README's accuracy protocol), through the launcher (cuda_sm80: two-level
    K)."""
    skip_unless_built(accum)
    q, k, v = mma.protocol_inputs(kind, 13)
    options = {} if accum is None else {"pv_accum": accum}
    out, lse = KERNELS[sage_backend.name].launcher(
        q, k, v, is_causal=causal, sm_scale=128**-0.5, smooth_k=True, return_lse=True, **options
    )
    ref, ref_lse = attention_ref(q, k, v, is_causal=causal, return_lse=True)
    stats = mma.check_exact(metrics, out, ref, sage_backend.pv)
    print(f"{sage_backend.name} {accum or 'default'} {kind} causal={causal} vs float64: {metrics.fmt(stats)}")
    # The LSE carries the INT8 error of the scores (P·V does not enter it): a few 1e-3 for most rows;
    # the first causal rows see one or two keys, so their LSE is one score and keeps its full INT8
    # error, which grows with |q| |k| (sm90 on an H100: up to 0.032 on randn, 0.067 on the outlier
    # set). A masking or scaling bug moves an LSE by O(1) (log 2 for a key counted twice).
    mma.check_lse(lse, ref_lse, atol=5e-2 if kind == "randn" else 0.1, what="lse vs float64")
    mma.check_tight(metrics, out, reference(sage_backend, q, k, v, causal=causal), sage_backend.pv)


@on(*KERNELS)
def test_without_smoothing_and_without_lse(sage_backend, metrics, mma):
    q, k, v = (mma.make(1, 2, 200, 64, "HND", torch.float16, s) for s in (19, 20, 21))
    out, lse = run_kernel(sage_backend, q, k, v, causal=False, smooth_k=False)
    assert lse is None
    ref = reference(sage_backend, q, k, v, causal=False, smooth_k=False)
    mma.check_tight(metrics, out, ref, sage_backend.pv)


# --------------------------------------------------------------------------------------------------
# The FP16 P·V kernel (cuda_sm80): one or two K digits, the output layout argument, the op


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n", [17, 1000])
@pytest.mark.parametrize("d", [64, 128])
@on(*FP16_KERNELS)
def test_single_level_k_matches_sage_ref(sage_backend, metrics, mma, causal, n, d):
    """The op without k_residual: one INT8 digit and the amax / 127 scale."""
    q, k, v = (mma.make(2, h, n, d, "NHD", torch.bfloat16, s) for h, s in ((4, 31), (2, 32), (2, 33)))
    mma.poison_allocator(((2, 4, n, d), torch.bfloat16), ((2, 4, n), torch.float32))
    out, lse = run_kernel(sage_backend, q, k, v, causal=causal, return_lse=True, residual=False)
    ref, ref_lse = reference(sage_backend, q, k, v, causal=causal, return_lse=True, k_residual=False)
    mma.check_tight(metrics, out, ref, sage_backend.pv)
    mma.check_lse(lse, ref_lse, atol=KERNELS[sage_backend.name].lse_atol)


@on(*FP16_KERNELS)
def test_two_level_k_is_more_accurate_on_outliers(sage_backend, metrics, mma):
    """The reason for the second K digit: the same outlier inputs, one digit against two."""
    q, k, v = mma.protocol_inputs("outlier", 13)
    ref = attention_ref(q, k, v)
    one, _ = run_kernel(sage_backend, q, k, v, causal=False, residual=False)
    two, _ = run_kernel(sage_backend, q, k, v, causal=False, residual=True)
    l1_one, l1_two = metrics.rel_l1(one, ref), metrics.rel_l1(two, ref)
    print(f"{sage_backend.name} outlier rel L1: one K digit {l1_one:.5f}, two {l1_two:.5f}")
    assert l1_two < l1_one, (l1_one, l1_two)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("residual", [False, True], ids=["k1", "k2"])
@on(*FP16_KERNELS)
def test_fp16_accumulation_variant(sage_backend, metrics, mma, d, residual):
    q, k, v = (mma.make(2, 4, 1000, d, "HND", torch.float16, s) for s in (16, 17, 18))
    out, _ = run_kernel(sage_backend, q, k, v, causal=True, pv_accum="fp16+fp32", residual=residual)
    ref = reference(sage_backend, q, k, v, causal=True, k_residual=residual)
    mma.check_tight(metrics, out, ref, sage_backend.pv)


@on(*FP16_KERNELS)
def test_out_layout_follows_out_nhd(sage_backend, mma):
    q, k, v = (mma.make(1, 2, 70, 64, "HND", torch.float16, s) for s in (22, 23, 24))
    a, _ = run_kernel(sage_backend, q, k, v, causal=False, out_nhd=False)
    c, _ = run_kernel(sage_backend, q, k, v, causal=False, out_nhd=True)
    assert a.is_contiguous() and c.transpose(1, 2).is_contiguous()
    assert torch.equal(a, c)


@on(*FP16_KERNELS)
def test_fp16_op_rejects_inputs_it_cannot_take(sage_backend, mma):
    kernel = KERNELS[sage_backend.name]
    op = getattr(ops, kernel.op)
    q, k, v = (mma.make(1, 2, 200, 64, "HND", torch.float16, s) for s in (25, 26, 27))
    km = k.mean(dim=2, dtype=torch.float32)
    qq, qs, _ = ops.quant_q_per_token(q, km, 0.125, 0.125 * LOG2E / 127, 64, 1, False)
    kq, ks, kr = ops.quant_k_per_block(k, km, kernel.key_block, 64, True)

    def attend(kq=kq, ks=ks, kr=kr, v=v, pv_accum="fp32"):
        return op(qq, kq, v, qs, ks, None, False, False, torch.float16, False, pv_accum, kr)

    attend()  # the valid call
    kq128, ks128 = ops.quant_k_per_block(k, km, 128, 64)
    with pytest.raises(RuntimeError, match="k_scale"):
        attend(kq=kq128, ks=ks128)
    with pytest.raises(RuntimeError, match=kernel.op_accum_error):
        attend(pv_accum="fp8")
    with pytest.raises(RuntimeError, match="k_residual"):
        attend(kr=kr[:, :, :100])
    with pytest.raises(RuntimeError, match="k_residual"):
        attend(kr=kr.float())
    with pytest.raises(RuntimeError, match="v must be"):
        attend(v=v.float())
    with pytest.raises(RuntimeError, match="v must be"):
        attend(v=v[:, :, :100])


@on(*FP16_KERNELS)
def test_fp16_op_fake_implementation_matches(sage_backend, mma):
    kernel = KERNELS[sage_backend.name]
    assert cuda_ops.registered(kernel.extension), cuda_ops.unavailable_reason(kernel.extension)
    q, k, v = (mma.make(1, 4, 130, 64, "NHD", torch.bfloat16, s) for s in (28, 29, 30))
    km = k.mean(dim=2, dtype=torch.float32)
    qq, qs, corr = ops.quant_q_per_token(q, km, 0.125, 0.125 * LOG2E / 127, 64, 1, True)
    kq, ks, kr = ops.quant_k_per_block(k, km, kernel.key_block, 64, True)
    checks = ("test_schema", "test_faketensor")
    for residual in (None, kr):
        args = (qq, kq, v.to(torch.float16), qs, ks, corr, True, True, torch.bfloat16, True, "fp32", residual)
        torch.library.opcheck(getattr(ops, kernel.op).default, args, test_utils=checks)
    for residual in (False, True):
        torch.library.opcheck(
            ops.quant_k_per_block.default, (k, km, kernel.key_block, 64, residual), test_utils=checks
        )


# --------------------------------------------------------------------------------------------------
# The FP8 P·V kernels (cuda_sm89, cuda_sm90): output layout, the op


@on(*FP8_KERNELS)
def test_out_layout_follows_q(sage_backend, mma):
    q, k, v = (mma.make(1, 2, 70, 64, "HND", torch.float16, s) for s in (22, 23, 24))
    a, _ = run_kernel(sage_backend, q, k, v, causal=False)
    c, _ = run_kernel(sage_backend, q.transpose(1, 2).contiguous().transpose(1, 2), k, v, causal=False)
    assert a.is_contiguous() and c.transpose(1, 2).is_contiguous()
    assert torch.equal(a, c)


@on(*FP8_KERNELS)
def test_fp8_op_rejects_inputs_it_cannot_take(sage_backend, mma):
    kernel = KERNELS[sage_backend.name]
    op = getattr(ops, kernel.op)
    q, k, v = (mma.make(1, 2, 200, 64, "HND", torch.float16, s) for s in (28, 29, 30))
    km = k.mean(dim=2, dtype=torch.float32)
    vmax = torch.linalg.vector_norm(v, ord=math.inf, dim=2, dtype=torch.float32)
    qq, qs, _ = ops.quant_q_per_token(q, km, 0.125, 0.125 * LOG2E / 127, 64, 1, False)
    vt = ops.quant_v_fp8(v, vmax, 64, 208, True)
    vs = vmax / 448
    kq, ks = ops.quant_k_per_block(k, km, kernel.key_block, 64)
    accum = kernel.pv_accums[:1]  # the op's pv_accum argument, where it has one

    def attend(kq=kq, ks=ks, vt=vt, vs=vs, out_dtype=torch.float16, accum=accum):
        return op(qq, kq, vt, qs, ks, vs, None, False, False, out_dtype, False, *accum)

    attend()  # the valid call
    # One scale per 128 keys (the sm90 layout) for the sm89 kernel, per 64 keys (the sm80 and sm89
    # layout) for the sm90 kernel.
    other_block = 128 if kernel.key_block == 64 else 64
    kq_other, ks_other = ops.quant_k_per_block(k, km, other_block, 64)
    with pytest.raises(RuntimeError, match="k_scale"):
        attend(kq=kq_other, ks=ks_other)
    with pytest.raises(RuntimeError, match="n_pad"):
        attend(vt=vt[..., :200])
    with pytest.raises(RuntimeError, match="v_scale"):
        attend(vs=vs[..., :60])
    with pytest.raises(RuntimeError, match="vt_fp8"):
        attend(vt=vt.float())
    with pytest.raises(RuntimeError, match="out_dtype"):
        attend(out_dtype=torch.float32)
    if kernel.pv_accums:
        with pytest.raises(RuntimeError, match=kernel.op_accum_error):
            attend(accum=("fp16",))


@on(*FP8_KERNELS)
def test_fp8_op_fake_implementation_matches(sage_backend, mma):
    kernel = KERNELS[sage_backend.name]
    assert cuda_ops.registered(kernel.extension), cuda_ops.unavailable_reason(kernel.extension)
    q, k, v = (mma.make(1, 4, 130, 96, "NHD", torch.bfloat16, s) for s in (31, 32, 33))
    km = k.mean(dim=2, dtype=torch.float32)
    vmax = torch.linalg.vector_norm(v, ord=math.inf, dim=2, dtype=torch.float32)
    qq, qs, corr = ops.quant_q_per_token(q, km, 0.1, 0.1 * LOG2E / 127, 128, 1, True)
    kq, ks = ops.quant_k_per_block(k, km, kernel.key_block, 128)
    vt = ops.quant_v_fp8(v, vmax, 128, 144, True)
    args = (qq, kq, vt, qs, ks, vmax / 448, corr, True, True, torch.bfloat16, True, *kernel.pv_accums[:1])
    # opcheck's test_schema compares inputs before and after with arithmetic that float8 tensors do
    # not support ("mul_cuda" not implemented for Float8_e4m3fn): the fake tensor check is what counts.
    checks = ("test_faketensor",)
    torch.library.opcheck(getattr(ops, kernel.op).default, args, test_utils=checks)
    torch.library.opcheck(ops.quant_v_fp8.default, (v, vmax, 128, 144, True), test_utils=checks)
    torch.library.opcheck(
        ops.quant_q_per_token.default, (q, km, 0.1, 0.1 * LOG2E / 127, 128, 1, True), test_utils=checks
    )


# --------------------------------------------------------------------------------------------------
# The sm89 kernel's P·V accumulations


@pytest.mark.parametrize("accum", KERNELS[SM89].pv_accums)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n,d", [(17, 64), (1000, 128), (4095, 64)])
@on(SM89)
def test_accumulation_variants(sage_backend, metrics, mma, accum, causal, n, d):
    skip_unless_built(accum)
    q, k, v = (mma.make(2, h, n, d, "NHD", torch.bfloat16, s) for h, s in ((4, 51), (2, 52), (2, 53)))
    mma.poison_allocator(((2, 4, n, d), torch.bfloat16), ((2, 4, n), torch.float32))
    out, lse = run_kernel(sage_backend, q, k, v, causal=causal, return_lse=True, pv_accum=accum)
    ref, ref_lse = reference(sage_backend, q, k, v, causal=causal, return_lse=True)
    mma.check_tight(metrics, out, ref, sage_backend.pv, what=f"{accum} vs sage_ref")
    mma.check_lse(lse, ref_lse, atol=KERNELS[sage_backend.name].lse_atol)


@pytest.mark.parametrize("accum", KERNELS[SM89].pv_accums)
@on(SM89)
def test_fp16_block_sums_cannot_overflow(sage_backend, metrics, mma, accum):
    """Every key sees the same large V (|v| up to 3e4): each 64-key block sums 64 * 448 * max|V'| in
    the accumulator, which "fp32+fp16" keeps below 65504 by its V scale. Nothing may turn Inf/NaN."""
    skip_unless_built(accum)
    q = mma.make(1, 2, 256, 128, "HND", torch.float16, 54) * 0.01  # flat scores: P ~ 1 for every key
    k = mma.make(1, 2, 256, 128, "HND", torch.float16, 55)
    v = torch.full((1, 2, 256, 128), 3.0e4, device="cuda", dtype=torch.float16)
    v[..., ::2] = -3.0e4
    out, _ = run_kernel(sage_backend, q, k, v, causal=False, pv_accum=accum)
    ref = reference(sage_backend, q, k, v, causal=False)
    mma.check_tight(metrics, out, ref, sage_backend.pv, what=f"{accum} vs sage_ref")


@on(SM89)
def test_launcher_compiles_without_graph_breaks(sage_backend, metrics, mma):
    """torch.compile(fullgraph=True) traces the launcher: quantization ops and kernel have fakes."""
    q, k, v = (mma.make(1, 4, 300, 64, "NHD", torch.bfloat16, s) for s in (34, 35, 36))
    launcher = KERNELS[sage_backend.name].launcher

    def fn(q, k, v):
        return launcher(q, k, v, is_causal=True, sm_scale=q.shape[-1] ** -0.5, smooth_k=True, return_lse=True)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    (a, la), (b, lb) = compiled(q, k, v), fn(q, k, v)
    assert metrics.cosine(a, b) >= 0.99999
    torch.testing.assert_close(la, lb)


# --------------------------------------------------------------------------------------------------
# The sm90 kernel: the launcher's one op against the two it combines, the permuted FP8 V it reads
# (quant_v_fp8(..., permute_keys=True)), bit for bit, and its block counts


def _two_ops_sm90(q, k, v, *, is_causal, sm_scale, smooth_k, return_lse):
    """The sm_90a call as two ops: quant_qkv_sm90, then qk_int8_sv_f8_attn_sm90."""
    d_pad = cuda_common.d_pad(q.shape[-1])
    with_corr = return_lse and smooth_k
    qq, qs, corr, kq, ks, vt, vs, _ = ops.quant_qkv_sm90(
        q, k, v, smooth_k, sm_scale, sm_scale * LOG2E / 127, d_pad, with_corr
    )
    out_nhd = q.stride(1) < q.stride(2)
    corr = corr if with_corr else None
    return ops.qk_int8_sv_f8_attn_sm90(qq, kq, vt, qs, ks, vs, corr, is_causal, return_lse, q.dtype, out_nhd)


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize(
    "causal,return_lse,smooth_k", [(False, False, True), (True, True, True), (False, True, False)],
    ids=["full", "causal-lse", "lse-unsmoothed"],
)  # fmt: skip
@pytest.mark.parametrize(
    "dtype,hq,hkv,n,d",
    [(torch.bfloat16, 4, 4, 1, 128), (torch.float16, 8, 2, 113, 64), (torch.bfloat16, 4, 1, 1000, 72),
     (torch.float16, 2, 2, 4095, 128)],
    ids=["n1", "gqa-d64", "mqa-d72", "n4095"],
)  # fmt: skip
@on(SM90)
def test_launcher_op_gives_the_two_ops_bits(
    sage_backend, mma, layout, causal, return_lse, smooth_k, dtype, hq, hkv, n, d
):
    """attention_sm90's one op (attn_sm90: the intermediates in one scratch buffer) returns exactly what
    quant_qkv_sm90 and qk_int8_sv_f8_attn_sm90 give, output memory layout included."""
    q = mma.make(2, hq, n, d, layout, dtype, 51)
    k, v = (mma.make(2, hkv, n, d, layout, dtype, s) for s in (52, 53))
    args = {"is_causal": causal, "sm_scale": d**-0.5, "smooth_k": smooth_k, "return_lse": return_lse}
    out, lse = cuda_sm90.attention_sm90(q, k, v, **args)
    ref, ref_lse = _two_ops_sm90(q, k, v, **args)
    assert out.dtype == dtype and out.stride() == ref.stride() and torch.equal(out, ref)
    assert (lse is None) != return_lse and (lse is None or torch.equal(lse, ref_lse))


@on(SM90)
def test_launcher_op_is_two_kernels(sage_backend, mma):
    """An eager call of the one op is two kernels on the GPU, the fused quantization (which clears its
    own counters) and the attention; captured into a CUDA graph, three (a clearing kernel first, as a
    replay repeats the quantization's arguments), and each replay on new inputs gives the eager bits."""
    q = mma.make(2, 8, 1000, 128, "NHD", torch.bfloat16, 57)
    k, v = (mma.make(2, 8, 1000, 128, "NHD", torch.bfloat16, s) for s in (58, 59))
    args = {"is_causal": False, "sm_scale": 128**-0.5, "smooth_k": True, "return_lse": True}
    on_gpu = mma.kernels_on_gpu(lambda: cuda_sm90.attention_sm90(q, k, v, **args))
    assert len(on_gpu) == 2 and "quant_qkv_kernel" in on_gpu[0] and "attn_int8_fp8_sm90" in on_gpu[1], on_gpu
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured, captured_lse = cuda_sm90.attention_sm90(q, k, v, **args)
    for seed, scale in ((60, 1.0), (61, 0.5), (62, 0.25)):
        new = [mma.make(2, 8, 1000, 128, "NHD", torch.bfloat16, seed + 10 * i) * scale for i in range(3)]
        for dst, src in zip((q, k, v), new):
            dst.copy_(src)
        graph.replay()
        out, lse = cuda_sm90.attention_sm90(*new, **args)
        assert torch.equal(captured, out) and torch.equal(captured_lse, lse), f"replay at scale {scale}"


@on(SM90)
def test_launcher_op_fake_implementation_matches(sage_backend, mma):
    extension = KERNELS[SM90].extension
    assert cuda_ops.registered(extension), cuda_ops.unavailable_reason(extension)
    q = mma.make(1, 4, 130, 96, "NHD", torch.bfloat16, 54)
    k, v = (mma.make(1, 2, 130, 96, "NHD", torch.bfloat16, s) for s in (55, 56))
    for causal, lse in ((True, True), (False, False)):
        args = (q, k, v, causal, 0.1, 0.1 * LOG2E / 127, 128, True, lse, True)
        torch.library.opcheck(ops.attn_sm90.default, args, test_utils=("test_faketensor",))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n,d", [(1, 128), (17, 64), (113, 72), (1000, 128), (4095, 40)])
@pytest.mark.parametrize("pad_to", [16, 128])
@on(SM90)
def test_quant_v_fp8_permute_keys_is_bit_exact(sage_backend, dtype, n, d, pad_to, mma):
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


@on(SM90)
def test_quant_v_fp8_permute_keys_needs_groups_of_16(sage_backend, mma):
    v = mma.make(1, 1, 20, 64, "HND", torch.float16, 2)
    vmax = torch.linalg.vector_norm(v, ord=math.inf, dim=2, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        ops.quant_v_fp8(v, vmax, 64, 24, True)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("nq,nk", [(64, 100), (200, 256), (300, 260), (1000, 1000), (129, 4095)])
@on(*supporting("per_warpgroup_blocks"))
def test_block_counts(sage_backend, metrics, causal, d, nq, nk, mma):
    """1, 2, 3, 8 and 32 key blocks (the last one is peeled off the loop; causal, the warpgroups of
    a CTA stop at different blocks, and some hold rows past nq), GQA, both output dtypes, with the
    LSE, into poisoned memory."""
    dtype = torch.bfloat16 if nk % 2 == 0 else torch.float16
    q = mma.make(2, 4, nq, d, "NHD", dtype, 40)
    k, v = mma.make(2, 2, nk, d, "NHD", dtype, 41), mma.make(2, 2, nk, d, "NHD", dtype, 42)
    mma.poison_allocator(((2, 4, nq, d), dtype), ((2, 4, nq), torch.float32))
    out, lse = run_kernel(sage_backend, q, k, v, causal=causal, return_lse=True)
    ref, ref_lse = reference(sage_backend, q, k, v, causal=causal, return_lse=True)
    mma.check_tight(metrics, out, ref, sage_backend.pv)
    mma.check_lse(lse, ref_lse, atol=KERNELS[sage_backend.name].lse_atol)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@on(SM90)
def test_persistent_ctas_take_every_tile_once(sage_backend, metrics, mma, causal, d):
    """The sm_90a kernel runs one CTA per SM, each drawing tiles from a counter: with several times
    more tiles than SMs (b=2, 40 query heads over 8 KV heads, n=1000: each head's last tile holds
    rows for one warpgroup only; causal tiles of unequal length, the last heads' drawn row block by row
    block and the others head by head, causal_tile), every row comes out right, a second
    call (its counter zeroed again) gives the same bits, and the two-op path (a counter of its own)
    agrees bit for bit."""
    q = mma.make(2, 40, 1000, d, "NHD", torch.bfloat16, 61)
    k, v = (mma.make(2, 8, 1000, d, "NHD", torch.bfloat16, s) for s in (62, 63))
    args = {"is_causal": causal, "sm_scale": d**-0.5, "smooth_k": True, "return_lse": True}
    out, lse = cuda_sm90.attention_sm90(q, k, v, **args)
    again, again_lse = cuda_sm90.attention_sm90(q, k, v, **args)
    two, two_lse = _two_ops_sm90(q, k, v, **args)
    assert torch.equal(out, again) and torch.equal(lse, again_lse)
    assert torch.equal(out, two) and torch.equal(lse, two_lse)
    ref, ref_lse = reference(sage_backend, q, k, v, causal=causal, return_lse=True)
    mma.check_tight(metrics, out, ref, sage_backend.pv)
    mma.check_lse(lse, ref_lse, atol=KERNELS[sage_backend.name].lse_atol)


@pytest.mark.parametrize(
    "b,hq,hkv,n,d",
    [(1, 2, 2, 2100, 128), (1, 8, 8, 4096, 128), (1, 5, 5, 3000, 64), (1, 4, 2, 2049, 64)],
    ids=["tiles-below-sms", "accuracy-shape", "d64", "gqa-d64"],
)  # fmt: skip
@on(SM90)
def test_split_tiles_merge_their_parts(sage_backend, metrics, mma, b, hq, hkv, n, d):
    """Non-causal, the sm_90a kernel splits the tiles of its last, partial wave along the keys
    (sm90_split_plan): each part writes its rows' partial output, maximum and sum, and the tile's last
    part merges them in part order. The shapes split on this GPU (tiles in 2 or 3 parts of 8-12 key
    blocks, the last one masked past Nk; tiles of one row; GQA): every row comes out right against
    sage_ref with the same split (key_parts), the LSE too, calls repeat bit for bit whichever part ends
    last, and the two-op path agrees."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    _, parts, _ = ops.sm90_split_plan(b, hq, n, n, d, False, sms)
    if parts == 1:
        pytest.skip(f"b={b} h={hq} n={n} d={d} splits no tile on {sms} SMs")
    q = mma.make(b, hq, n, d, "NHD", torch.bfloat16, 71)
    k, v = (mma.make(b, hkv, n, d, "NHD", torch.bfloat16, s) for s in (72, 73))
    args = {"is_causal": False, "sm_scale": d**-0.5, "smooth_k": True, "return_lse": True}
    out, lse = cuda_sm90.attention_sm90(q, k, v, **args)
    for _ in range(3):
        again, again_lse = cuda_sm90.attention_sm90(q, k, v, **args)
        assert torch.equal(out, again) and torch.equal(lse, again_lse)
    two, two_lse = _two_ops_sm90(q, k, v, **args)
    assert torch.equal(out, two) and torch.equal(lse, two_lse)
    ref, ref_lse = reference(sage_backend, q, k, v, causal=False, return_lse=True)
    mma.check_tight(metrics, out, ref, sage_backend.pv)
    mma.check_lse(lse, ref_lse, atol=KERNELS[sage_backend.name].lse_atol)
    # The split is real and simulated right: on the split rows the kernel is far closer to sage_ref with
    # the split than to sage_ref without it (its parts round P against their own maxima).
    split = cuda_sm90.key_parts(b, hq, n, n, d, False) > 1
    whole, whole_lse = reference(sage_backend, q, k, v, causal=False, return_lse=True, key_parts=None)
    near = (out.float() - ref)[split].abs().max().item()
    far = (out.float() - whole)[split].abs().max().item()
    assert near < 0.5 * far, f"split rows: {near} from the split reference, {far} from the unsplit one"
    assert (lse - ref_lse)[split].abs().max().item() < 0.5 * (lse - whole_lse)[split].abs().max().item()


@on(SM90)
def test_split_plan(sage_backend):
    """The split the kernel takes: none for causal attention, whole waves or tiles of few key blocks
    (parts of 8 blocks at least; a part costs about four blocks more than its share); the last wave's
    tiles in as many parts as fill the SMs, at most 4. Tiles of 192 query rows at d_pad 128, 256 at 64."""
    plan = ops.sm90_split_plan
    assert plan(4, 32, 4096, 4096, 128, False, 132) == [2816 - 44, 3, 192]  # 44 tiles in the last wave
    assert plan(1, 24, 4608, 4608, 128, False, 132) == [576 - 48, 2, 192]
    assert plan(1, 5, 3000, 3000, 64, False, 132) == [0, 2, 256]  # 60 tiles of 24 key blocks
    assert plan(4, 32, 4096, 4096, 128, True, 132)[1] == 1
    assert plan(1, 22, 4608, 4608, 128, False, 132)[1] == 1  # 528 tiles: four whole waves
    assert plan(1, 1, 4096, 4096, 128, False, 132) == [0, 4, 192]  # 22 tiles of 32 key blocks
    assert plan(1, 24, 1024, 1024, 128, False, 132)[1] == 1  # 8 key blocks a tile: parts would be short
    assert plan(1, 1, 256, 256, 128, False, 132)[1] == 1  # 2 key blocks: halves would cost 5 each
    with pytest.raises(RuntimeError, match="d_pad must be 64 or 128"):
        plan(1, 1, 128, 128, 96, False, 132)


# --------------------------------------------------------------------------------------------------
# The public API: sageattn_qk_int8_pv_fp16_cuda (cuda_sm80), sageattn_qk_int8_pv_fp8_cuda (cuda_sm89)


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@on_each_accum("public_accums")
def test_public_cuda_variant(sage_backend, accum, metrics, mma, layout):
    skip_unless_built(accum)
    q = mma.make(2, 8, 777, 128, layout, torch.bfloat16, 40)
    k, v = (mma.make(2, 2, 777, 128, layout, torch.bfloat16, s) for s in (41, 42))
    as_layout = (lambda x: x) if layout == "HND" else (lambda x: x.transpose(1, 2))
    out, lse = sage_backend.call(
        as_layout(q), as_layout(k), as_layout(v), tensor_layout=layout, is_causal=True, pv_accum_dtype=accum,
        return_lse=True,
    )  # fmt: skip
    assert out.shape == as_layout(q).shape and out.dtype == torch.bfloat16
    ref, ref_lse = reference(sage_backend, q, k, v, causal=True, return_lse=True)
    mma.check_tight(metrics, as_layout(out), ref, sage_backend.pv)
    mma.check_lse(lse, ref_lse, atol=KERNELS[sage_backend.name].lse_atol)


@on(*supporting("public_accums"))
def test_public_cuda_options(sage_backend, mma):
    kernel = KERNELS[sage_backend.name]
    accum = kernel.public_accums[0]
    q, k, v = (mma.make(1, 4, 300, 64, "HND", torch.float16, s) for s in (43, 44, 45))
    a = sage_backend.call(q, k, v, qk_quant_gran="per_warp", pv_accum_dtype=accum)
    b = sage_backend.call(q, k, v, qk_quant_gran="per_thread", pv_accum_dtype=accum, smooth_v=True)
    assert torch.equal(a, b), "qk_quant_gran and smooth_v are accepted for compatibility and change nothing"
    with pytest.raises(ValueError, match=kernel.public_accum_error):
        sage_backend.call(q, k, v, pv_accum_dtype="fp16")


@on(*FP16_KERNELS)
def test_public_fp16_cuda_head_dim_not_a_multiple_of_8(sage_backend, metrics, mma):
    """Head dims the kernel's 16-byte rows cannot take run through the Triton FP16 kernels (same
    quantization) when Triton is there."""
    pytest.importorskip("sageattention.triton")
    q, k, v = (mma.make(1, 4, 200, 36, "HND", torch.float16, s) for s in (46, 47, 48))
    out = sage_backend.call(q, k, v, is_causal=True)
    mma.check_tight(metrics, out, reference(sage_backend, q, k, v, causal=True), sage_backend.pv)
