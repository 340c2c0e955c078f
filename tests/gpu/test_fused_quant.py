"""The compiled fused quantization ops (csrc/fused) against the reference quantization and the Triton
quantization kernels, bit for bit (two-level K included), and the attention they feed against the
simulated-quantization reference. quant_qkv_sm90 (the sm_90a call's Q, K and V in one launch, two for
long sequences) against the separate ops, bit for bit given its K mean."""

from __future__ import annotations

import importlib

import pytest
import torch

from sageattention.quant import FP8_E4M3_MAX, K_RESIDUAL_MUL, LOG2E, PVDtype
from sageattention.reference import quantize_per_block_ref, quantize_v_fp8_ref

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
try:
    importlib.import_module("sageattention._fused")
except ImportError as exc:
    pytest.skip(f"sageattention._fused is not built: {exc}", allow_module_level=True)

launch = pytest.importorskip("sageattention.triton.launch")
ops = torch.ops.sageattention

from sageattention import cuda_ops  # noqa: E402  (registers the fake implementations)


def hnd(b, h, n, d, layout, dtype):
    x = torch.randn(b, h, n, d, device="cuda", dtype=dtype) * 3
    return x if layout == "HND" else x.transpose(1, 2).contiguous().transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("n,d", [(1, 128), (17, 64), (113, 72), (1000, 128), (4095, 40)])
def test_int8_quantization_is_bit_exact(dtype, layout, n, d):
    b, hq, hkv = 2, 4, 2
    q, k = hnd(b, hq, n, d, layout, dtype), hnd(b, hkv, n, d, layout, dtype) + 5
    d_pad = launch._d_pad(d)
    sm_scale = d**-0.5
    km = k.mean(dim=2, dtype=torch.float32)
    qq, qs, corr = ops.quant_q_per_token(q, km, sm_scale, sm_scale * LOG2E / 127, d_pad, hq // hkv, True)
    ref_q, ref_qs = quantize_per_block_ref(q.float(), 1, extra_scale=sm_scale * LOG2E)
    assert torch.equal(qq[..., :d].float(), ref_q) and not qq[..., d:].any()
    assert torch.equal(qs, ref_qs)
    ref_corr = sm_scale * (q.float() @ km.repeat_interleave(hq // hkv, dim=1).unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(corr, ref_corr, rtol=1e-5, atol=1e-4)
    for block in (64, 128):
        kq, ks = ops.quant_k_per_block(k, km, block, d_pad)
        ref_k, ref_ks = quantize_per_block_ref(k.float() - km.unsqueeze(2), block)
        assert torch.equal(kq[..., :d].float(), ref_k) and torch.equal(ks, ref_ks)


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    bad = (a != b).nonzero()
    return f"{len(bad)} elements differ; first (b, h, token, channel): {bad[:6].tolist()}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("smooth", [True, False])
@pytest.mark.parametrize("n,d", [(1, 128), (17, 64), (113, 72), (1000, 128), (4095, 40)])
def test_two_level_k_is_bit_exact(dtype, layout, smooth, n, d):
    """quant_k_per_block(..., residual=True) against the Triton kernel (digits and scale, bit for bit)
    and against quantize_per_block_ref(residual=True) (which returns k1 * 254 + k2)."""
    k = hnd(2, 3, n, d, layout, dtype) + 5
    d_pad = launch._d_pad(d)
    km = k.mean(dim=2, dtype=torch.float32) if smooth else None
    kq, ks, kr = ops.quant_k_per_block(k, km, 64, d_pad, True)
    assert kq.shape == kr.shape == (2, 3, n, d_pad) and kr.dtype == torch.int8
    tq, tr, ts = launch._quantize_k(
        k, km, None, n=n, batch=2, block_n=64, d_pad=d_pad, varlen=False, residual=True
    )
    assert torch.equal(kq, tq), "first digit vs Triton: " + _first_difference(kq, tq)
    assert torch.equal(kr, tr), "second digit vs Triton: " + _first_difference(kr, tr)
    assert torch.equal(ks, ts), "scale vs Triton: " + _first_difference(ks, ts)
    kf = k.float() - km.unsqueeze(2) if smooth else k.float()
    ref_k, ref_ks = quantize_per_block_ref(kf, 64, residual=True)
    combined = kq[..., :d].float() * K_RESIDUAL_MUL + kr[..., :d].float()
    assert torch.equal(combined, ref_k), "k1 * 254 + k2 vs reference: " + _first_difference(combined, ref_k)
    assert torch.equal(ks, ref_ks), "scale vs reference: " + _first_difference(ks, ref_ks)
    assert not kq[..., d:].any() and not kr[..., d:].any(), "channels past D must be zeros"
    assert kr.abs().max() <= 127 and kq.abs().max() <= 127
    # The one-level call still returns two tensors, and the first digit is the one-level INT8 K.
    one = ops.quant_k_per_block(k, km, 64, d_pad)
    assert len(one) == 2 and torch.equal(one[0], kq)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n,d", [(1, 128), (113, 64), (1000, 72)])
def test_fp8_v_is_bit_exact(dtype, n, d):
    v = hnd(2, 3, n, d, "NHD", dtype)
    vmax = torch.linalg.vector_norm(v, ord=float("inf"), dim=2, dtype=torch.float32)
    n_pad = -(-n // 16) * 16
    vt = ops.quant_v_fp8(v, vmax, launch._d_pad(d), n_pad)
    ref_v, _ = quantize_v_fp8_ref(v)
    assert torch.equal(vt[:, :, :d, :n].float().transpose(-1, -2), ref_v)
    assert not vt[:, :, d:, :n].float().any()


@pytest.mark.parametrize("pv", [PVDtype.FP16, PVDtype.FP8], ids=lambda p: p.value)
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_and_triton_quantization_give_the_same_attention(pv, causal):
    q, k, v = (hnd(2, 8, 1000, 128, "NHD", torch.bfloat16) for _ in range(3))
    args = dict(is_causal=causal, sm_scale=128**-0.5, pv=pv, smooth_k=True, return_lse=True)
    out_t, lse_t = launch.attention_fwd(q, k, v, quant_backend="triton", **args)
    out_c, lse_c = launch.attention_fwd(q, k, v, quant_backend="cuda", **args)
    assert torch.equal(out_t, out_c)
    torch.testing.assert_close(lse_t, lse_c, rtol=0, atol=1e-5)


# --------------------------------------------------------------------------------------------------
# quant_qkv_sm90: Q, K and V of one sm_90a attention call in one kernel launch (two for long sequences)


QKV_MODES = [(True, True), (True, False), (False, False)]  # (smooth_k, with_corr)
QKV_MODE_IDS = ["smooth-corr", "smooth", "plain"]


def _qkv_args(q, k, v, smooth_k, with_corr):
    d = q.shape[-1]
    sm_scale = d**-0.5
    return (q, k, v, smooth_k, sm_scale, sm_scale * LOG2E / 127, launch._d_pad(d), with_corr)


def _poison_qkv_outputs(mma, q, k, d_pad):
    """0xFF-filled blocks of the outputs' sizes handed back to the caching allocator
    (mma.fill_freed_blocks)."""
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    n_pad = -(-nk // 16) * 16
    int8s = (b * hq * nq * d_pad, b * hkv * nk * d_pad, b * hkv * d_pad * n_pad)
    floats = (b * hq * nq, b * hkv * d)
    mma.fill_freed_blocks((*int8s, *(4 * n for n in floats)))


def _assert_same(name: str, got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.shape == expected.shape and got.dtype == expected.dtype, (
        f"{name}: {got.dtype} {tuple(got.shape)}, expected {expected.dtype} {tuple(expected.shape)}"
    )
    if got.dtype == torch.float8_e4m3fn:  # compared as bytes: no comparison kernels for float8
        got, expected = got.view(torch.uint8), expected.view(torch.uint8)
    assert torch.equal(got, expected), f"{name}: " + _first_difference(got, expected)


def _assert_matches_separate_ops(q, k, v, smooth_k, with_corr, outputs):
    """Every output of quant_qkv_sm90 against the separate ops fed with its own k_mean and torch's
    max |V| (bit for bit), and k_mean against torch's mean (float32 summation order apart)."""
    qq, qs, corr, kq, ks, vt, vs, km = outputs
    sm_scale, scale_mul, d_pad = _qkv_args(q, k, v, smooth_k, with_corr)[4:7]
    b, hq = q.shape[:2]
    hkv, nk, d = k.shape[1], k.shape[2], k.shape[3]
    if smooth_k:
        ref_km = k.mean(dim=2, dtype=torch.float32)
        atol = 1e-5 * k.float().abs().amax().item()
        torch.testing.assert_close(km, ref_km, rtol=1e-5, atol=atol)
    else:
        assert km.shape == (0,) and km.dtype == torch.float32
    mean = km if smooth_k else None
    kv_group = hq // hkv
    ref_qq, ref_qs, ref_corr = ops.quant_q_per_token(q, mean, sm_scale, scale_mul, d_pad, kv_group, with_corr)
    _assert_same("q_int8", qq, ref_qq)
    _assert_same("q_scale", qs, ref_qs)
    assert corr.shape == ref_corr.shape == ((b if with_corr else 0), hq, q.shape[2])
    if with_corr:
        _assert_same("corr", corr, ref_corr)
    ref_kq, ref_ks = ops.quant_k_per_block(k, mean, 128, d_pad)
    _assert_same("k_int8", kq, ref_kq)
    _assert_same("k_scale", ks, ref_ks)
    vmax = torch.linalg.vector_norm(v, ord=float("inf"), dim=2, dtype=torch.float32)
    n_pad = -(-nk // 16) * 16
    _assert_same("vt", vt, ops.quant_v_fp8(v, vmax, d_pad, n_pad, True))
    assert vs.shape == (b, hkv, d)
    nan = torch.isnan(vmax)
    assert torch.equal(torch.isnan(vs), nan), "v_scale: NaN where max |V| is not, or the other way round"
    _assert_same("v_scale (finite)", vs[~nan], vmax[~nan] * (1.0 / FP8_E4M3_MAX))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("n,d", [(1, 128), (17, 64), (113, 72), (1000, 128), (4095, 40)])
@pytest.mark.parametrize("smooth_k,with_corr", QKV_MODES, ids=QKV_MODE_IDS)
def test_quant_qkv_sm90_is_bit_exact(mma, dtype, layout, n, d, smooth_k, with_corr):
    b, hq, hkv = 2, 4, 2  # GQA: 2 query heads per KV head
    q, v = hnd(b, hq, n, d, layout, dtype), hnd(b, hkv, n, d, layout, dtype)
    k = hnd(b, hkv, n, d, layout, dtype) + 5  # an offset that smooth-K removes
    _poison_qkv_outputs(mma, q, k, launch._d_pad(d))
    outputs = ops.quant_qkv_sm90(*_qkv_args(q, k, v, smooth_k, with_corr))
    _assert_matches_separate_ops(q, k, v, smooth_k, with_corr, outputs)


# (b, hq, hkv, nq, nk); the fourth one's statistics take 64 short chunks per head (one launch), the
# last one's chunks are long enough for the two-launch path
OTHER_SHAPES = [
    (1, 24, 24, 4608, 4608),
    (2, 8, 2, 300, 1000),
    (1, 2, 1, 900, 33),
    (1, 4, 2, 300, 16384),
    (1, 2, 1, 2000, 32768),
]


@pytest.mark.parametrize("b,hq,hkv,nq,nk", OTHER_SHAPES)
def test_quant_qkv_sm90_other_shapes(b, hq, hkv, nq, nk):
    """Few heads and long sequences (b=1, h=24, n=4608: the statistics split each head into many
    chunks), and query and key lengths that differ (cross attention, a short KV cache)."""
    q = hnd(b, hq, nq, 128, "NHD", torch.bfloat16)
    k, v = hnd(b, hkv, nk, 128, "NHD", torch.bfloat16) - 2, hnd(b, hkv, nk, 128, "NHD", torch.bfloat16)
    outputs = ops.quant_qkv_sm90(*_qkv_args(q, k, v, True, True))
    _assert_matches_separate_ops(q, k, v, True, True, outputs)


def test_quant_qkv_sm90_reads_unaligned_views():
    """A base that is not 16-byte aligned (a storage offset of 4 elements) takes the 2-byte loads; the
    outputs are those of an aligned copy, bit for bit."""

    def offset_view(h, shift=0.0):
        flat = torch.randn(2 * h * 333 * 64 + 4, device="cuda") * 3 + shift
        return flat.half()[4:].view(2, h, 333, 64)

    q, k, v = offset_view(4), offset_view(2, shift=5.0), offset_view(2)
    assert all(x.data_ptr() % 16 for x in (q, k, v))
    outputs = ops.quant_qkv_sm90(*_qkv_args(q, k, v, True, True))
    _assert_matches_separate_ops(q, k, v, True, True, outputs)
    aligned = ops.quant_qkv_sm90(*_qkv_args(q.clone(), k.clone(), v.clone(), True, True))
    names = ("q_int8", "q_scale", "corr", "k_int8", "k_scale", "vt", "v_scale", "k_mean")
    for name, got, expected in zip(names, outputs, aligned):
        _assert_same(f"{name} (unaligned vs aligned)", got, expected)


def test_quant_qkv_sm90_keeps_nan_in_v():
    """A NaN in V makes its channel's v_scale NaN (the NaN-keeping max, as torch's max |V|); the other
    channels and Q, K stay as the separate ops give them."""
    q, k, v = (hnd(2, 4, 200, 64, "HND", torch.bfloat16) for _ in range(3))
    v[1, 0, 77, 3] = float("nan")
    outputs = ops.quant_qkv_sm90(*_qkv_args(q, k, v, True, True))
    vs = outputs[6]
    assert torch.isnan(vs[1, 0, 3]) and torch.isnan(vs).sum() == 1
    _assert_matches_separate_ops(q, k, v, True, True, outputs)


def _bits(x: torch.Tensor) -> torch.Tensor:
    """x's bit patterns: equal NaNs compare equal."""
    return x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("smooth_k", [True, False], ids=["smooth", "plain"])
def test_quant_qkv_sm90_special_values_in_q_and_k(dtype, smooth_k):
    """Signed zeros, subnormals, the type's largest values, and (without smooth-K, whose mean they would
    make NaN) infinities and NaN in Q and K: quant_qkv_sm90 gives the separate ops' bits, NaN
    included, and a K block or Q token holding a NaN gets a NaN scale."""
    b, h, n, d = 1, 2, 300, 128
    q, k, v = hnd(b, h, n, d, "HND", dtype), hnd(b, h, n, d, "HND", dtype) + 5, hnd(b, h, n, d, "HND", dtype)
    tiny, big = torch.finfo(dtype).smallest_normal / 8, torch.finfo(dtype).max / 4
    for x in (q, k):
        x[0, 0, 10, :] = -0.0
        x[0, 0, 11, :64] = tiny
        x[0, 0, 12, 64:] = -tiny
        x[0, 1, 140, 5] = big
        x[0, 1, 141, 5] = -big
        x[0, 0, 260:300, 9] = 0.0  # the last (short) block: one channel all zeros
    if not smooth_k:
        for x in (q, k):
            x[0, 0, 20, 3] = float("nan")
            x[0, 1, 150, 7] = float("inf")
            x[0, 1, 200, 100] = float("-inf")
    args = _qkv_args(q, k, v, smooth_k, False)
    sm_scale, scale_mul, d_pad = args[4:7]
    qq, qs, _, kq, ks, _, _, km = ops.quant_qkv_sm90(*args)
    mean = km if smooth_k else None
    ref_qq, ref_qs, _ = ops.quant_q_per_token(q, mean, sm_scale, scale_mul, d_pad, 1, False)
    ref_kq, ref_ks = ops.quant_k_per_block(k, mean, 128, d_pad)
    pairs = {"q_int8": (qq, ref_qq), "q_scale": (qs, ref_qs), "k_int8": (kq, ref_kq), "k_scale": (ks, ref_ks)}
    for name, (got, expected) in pairs.items():
        got, expected = _bits(got), _bits(expected)
        assert torch.equal(got, expected), f"{name}: " + _first_difference(got, expected)
    if not smooth_k:
        assert torch.isnan(ks[0, 0, 0]) and torch.isnan(qs[0, 0, 20])
        assert torch.isinf(ks[0, 1, 1]) and torch.isinf(qs[0, 1, 150]) and torch.isinf(qs[0, 1, 200])
        assert torch.isfinite(ks[0, 0, 1:]).all() and torch.isfinite(ks[0, 1, 0])
    else:
        assert torch.isfinite(ks).all() and torch.isfinite(qs).all()


@pytest.mark.parametrize("smooth_k,with_corr", [(True, True), (False, False)], ids=["smooth-corr", "plain"])
@pytest.mark.parametrize(
    "heads,n,kernels",
    [(8, 1024, 1), (2, 16384, 1), (1, 32768, 2)],
    ids=["one-launch", "short-stats-chunks", "long-stats-chunks"],
)
def test_quant_qkv_sm90_launches_its_kernel_alone(mma, smooth_k, with_corr, heads, n, kernels):
    """quant_qkv_kernel alone on the GPU (its first CTAs clear the counters and V's maxima in the
    workspace): no clearing kernel, no memset, no reduction or elementwise kernel. It runs once, also
    where 64 statistics chunks of 256 tokens cover a KV head (n=16384), or twice (statistics, then the
    quantizing items) where the chunks stay long (here 1024 tokens of one KV head: 256-token chunks
    would be 128, above 64)."""
    q, k, v = (hnd(1, heads, n, 128, "NHD", torch.bfloat16) for _ in range(3))
    args = _qkv_args(q, k, v, smooth_k, with_corr)
    on_gpu = mma.kernels_on_gpu(lambda: ops.quant_qkv_sm90(*args))
    assert len(on_gpu) == kernels, on_gpu
    assert all("quant_qkv_kernel" in name for name in on_gpu), on_gpu


QKV_OUTPUTS = ("q_int8", "q_scale", "corr", "k_int8", "k_scale", "vt", "v_scale", "k_mean")


@pytest.mark.parametrize("heads,n", [(8, 1024), (1, 32768)], ids=["one-launch", "two-launches"])
def test_quant_qkv_sm90_clears_its_workspace_itself(mma, heads, n):
    """The counters and V's maxima cleared by the quantization's own first CTAs, whatever the scratch
    held: stale data of every byte value, an earlier call's counts and marks (the same scratch, reused:
    each eager call marks its clearing with a value of its own). Every call gives the first one's bits,
    also after calls on other data (whose V maxima, left in the scratch, are larger)."""
    q, k, v = (hnd(1, heads, n, 128, "NHD", torch.bfloat16) for _ in range(3))
    args = _qkv_args(q, k, v, True, True)
    expected = ops.quant_qkv_sm90(*args)
    big = _qkv_args(q * 8, k * 8, v * 8, True, True)
    workspace = 4 * (2 * heads * 128 * 64 + 8192)  # about the workspace's bytes, and larger
    for value in (0, 255, 0x55, None):
        if value is None:
            ops.quant_qkv_sm90(*big)  # its counts, marks and larger maxima left behind
        else:
            mma.fill_freed_blocks([workspace, 2 * workspace, 4 * workspace], value)
        got = ops.quant_qkv_sm90(*args)
        for name, a, b in zip(QKV_OUTPUTS, got, expected):
            _assert_same(f"{name} (scratch {value})", a, b)


@pytest.mark.parametrize("heads,n", [(8, 1024), (1, 32768)], ids=["one-launch", "two-launches"])
def test_quant_qkv_sm90_in_a_cuda_graph_replays_on_new_inputs(heads, n):
    """Captured into a CUDA graph, the quantization clears by a kernel of its own (a replay repeats
    the launch's arguments, so marks of the capture's value would be stale from the second replay on):
    each replay on new inputs, smaller and smaller (stale V maxima would show), gives the eager call's
    bits."""
    q, k, v = (hnd(1, heads, n, 128, "NHD", torch.bfloat16) for _ in range(3))
    args = _qkv_args(q, k, v, True, True)
    ops.quant_qkv_sm90(*args)  # loads the module and warms up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = ops.quant_qkv_sm90(*args)
    for scale in (1.0, 0.5, 0.25, 0.125):
        new = [hnd(1, heads, n, 128, "NHD", torch.bfloat16) * scale for _ in range(3)]
        for dst, src in zip((q, k, v), new):
            dst.copy_(src)
        graph.replay()
        expected = ops.quant_qkv_sm90(*_qkv_args(*new, True, True))
        for name, a, b in zip(QKV_OUTPUTS, captured, expected):
            _assert_same(f"{name} (replay at scale {scale})", a, b)


def test_quant_qkv_sm90_rejects_inputs_it_cannot_take():
    q, k, v = (hnd(1, 2, 64, 64, "HND", torch.float16) for _ in range(3))
    with pytest.raises(RuntimeError, match="with_corr needs smooth_k"):
        ops.quant_qkv_sm90(*_qkv_args(q, k, v, False, True))
    with pytest.raises(RuntimeError, match="one dtype"):
        ops.quant_qkv_sm90(*_qkv_args(q, k.bfloat16(), v, True, True))
    with pytest.raises(RuntimeError, match="multiple of the KV heads"):
        ops.quant_qkv_sm90(*_qkv_args(hnd(1, 3, 64, 64, "HND", torch.float16), k, v, True, True))
    with pytest.raises(RuntimeError, match="d_pad"):
        ops.quant_qkv_sm90(q, k, v, True, 0.125, 0.125 * LOG2E / 127, 32, True)


def test_quant_qkv_sm90_fake_implementation_matches():
    assert cuda_ops.registered("sageattention._fused"), cuda_ops.unavailable_reason("sageattention._fused")
    q, k, v = (hnd(1, h, 130, 96, "NHD", torch.bfloat16) for h in (4, 2, 2))
    for smooth_k, with_corr in ((True, True), (False, False)):
        # opcheck's test_schema compares inputs before and after with arithmetic that float8 tensors do
        # not support: the fake tensor check is what counts.
        args = _qkv_args(q, k, v, smooth_k, with_corr)
        torch.library.opcheck(ops.quant_qkv_sm90.default, args, test_utils=("test_faketensor",))
