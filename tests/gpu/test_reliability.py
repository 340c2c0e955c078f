"""Reliability of every quantized entry point on one GPU: conftest's ``sage_backend`` runs each test
for ``sageattn`` (whatever dispatch picks here), the Triton FP16 and FP8 P·V variants and the compiled
sm80, sm89 and sm90 kernels, where built and runnable on this GPU.

* 64-bit offsets: tensors of more than 2^31 elements, checked at their far end (in a subprocess: an
  out-of-bounds access would otherwise leave this process without a usable CUDA context).
* Sizes: sequence lengths from 1, batch or heads of 1, one query against long K/V.
* NaN and Inf: what one poisoned element does, derived from the kernels (see NAN_INF_CASES); it never
  reaches another batch entry, another K/V head group, or (for Q) another row.
* Determinism: repeated runs give the same bits.
* Streams: a call runs on the current stream and never blocks the host on the GPU; threads on their
  own streams get correct results.
* Memory: the extra device memory of a call stays under a bound computed from the tensor sizes
  (printed with the measurement, ``pytest -s`` shows it), and thousands of calls do not grow it.

On an H100 the file should take about a minute, a third of it the six 2^31 subprocesses (a few
seconds each, mostly starting Python and CUDA), plus Triton compiling kernels for the odd sizes on a
cold cache.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
import torch

import sageattention
from sageattention.quant import PVDtype
from sageattention.reference import attention_ref, sage_ref

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

MiB = 1 << 20
GiB = 1 << 30
#: LSE against sage_ref's: one INT8 rounding flip (the K mean differs in its last bit) moves a short
#: row by about 2e-3 (as in test_fuzz_gpu.py).
LSE_ATOL = 1e-2


def qkv(mma, b, hq, hkv, nq, nk, d, seed, layout="HND", dtype=torch.bfloat16):
    """q, k, v as [B, H, N, D] views (NHD memory for layout "NHD"); pass them with the default
    tensor_layout "HND"."""
    return (
        mma.make(b, hq, nq, d, layout, dtype, seed),
        mma.make(b, hkv, nk, d, layout, dtype, seed + 1),
        mma.make(b, hkv, nk, d, layout, dtype, seed + 2),
    )


# --------------------------------------------------------------------------------------------------
# 64-bit offsets


@dataclass(frozen=True)
class BigCase:
    name: str
    b: int
    hq: int
    hkv: int
    nq: int
    nk: int
    d: int
    layout: str
    dtype: str


#: q_rows_nhd: Q and the output in NHD memory, 1 x (2^20 + 384) x 16 x 128 = 2^31 + 786432 elements;
#: the token stride is H * D = 2048, so every row from 2^20 on starts at 2^31 or beyond (a row offset
#: computed in 32 bits wraps). Allocates Q 4 GiB, the output 4 GiB, INT8 Q 2 GiB, three per-token float32
#: vectors 64 MiB each (scale, LSE correction, LSE): about 10.2 GiB.
#: kv_batch_hnd: K and V in HND memory, 17 x 16 x 2^16 x 128 = 2^31 + 2^27 elements each; the batch
#: stride is 2^27, so batch entry 16 starts at exactly 2^31. Allocates K and V 4.25 GiB each (fp16, so
#: the FP16 P·V paths use V as it is), INT8 K 2.1 GiB, and K's second INT8 digit (FP16 P·V) or FP8 V
#: 2.1 GiB: about 12.8 GiB. The cases run one after the other.
BIG_CASES = (
    BigCase("q_rows_nhd", 1, 16, 16, (1 << 20) + 384, 256, 128, "NHD", "bfloat16"),
    BigCase("kv_batch_hnd", 17, 16, 16, 128, 1 << 16, 128, "HND", "float16"),
)
BIG_FREE_BYTES = 16 * GiB
BIG_TIMEOUT_S = 300

# Runs in a fresh interpreter: builds each case, calls the entry point, and saves the far end of the
# output (last batch entry, last head, last 300 rows) with sage_ref of that slice alone (Q is
# quantized per token and K/V per (batch, head), so the slice is the same computation).
_BIG_CHILD = r"""
import json, sys
import torch
import sageattention
from sageattention.quant import PVDtype
from sageattention.reference import sage_ref

args = json.loads(sys.argv[1])
call = getattr(sageattention, args["function"])
results = {}
for case in args["cases"]:
    options = args["reference_options"][case["name"]]
    options = dict(options, pv=PVDtype(options["pv"]))
    b, hq, hkv, nq, nk, d = (case[key] for key in ("b", "hq", "hkv", "nq", "nk", "d"))
    layout, dtype = case["layout"], getattr(torch, case["dtype"])
    gen = torch.Generator(device="cuda").manual_seed(0)

    def make(heads, n):
        shape = (b, heads, n, d) if layout == "HND" else (b, n, heads, d)
        return torch.randn(shape, device="cuda", dtype=dtype, generator=gen)

    def hnd(x):
        return x if layout == "HND" else x.transpose(1, 2)

    q, k, v = make(hq, nq), make(hkv, nk), make(hkv, nk)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    out, lse = call(q, k, v, tensor_layout=layout, return_lse=True)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    bi, hi = b - 1, hq - 1
    hk = hi // (hq // hkv)
    rows = slice(max(0, nq - 300), nq)
    qs = hnd(q)[bi : bi + 1, hi : hi + 1, rows]
    ks, vs = (hnd(x)[bi : bi + 1, hk : hk + 1] for x in (k, v))
    if args["sm90"]:  # the kernel's split tiles, as they fall in the slice
        from sageattention import cuda_sm90

        parts = cuda_sm90.key_parts(b, hq, nq, nk, d, False)
        if parts is not None:
            options["key_parts"] = parts[bi : bi + 1, hi : hi + 1, rows]
    ref, ref_lse = sage_ref(qs, ks, vs, return_lse=True, **options)
    results[case["name"]] = {
        "out": hnd(out)[bi : bi + 1, hi : hi + 1, rows].cpu(),
        "lse": lse[bi : bi + 1, hi : hi + 1, rows].cpu(),
        "ref": ref.cpu(),
        "ref_lse": ref_lse.cpu(),
        "peak_bytes": peak,
    }
    del q, k, v, out, lse, qs, ks, vs
    torch.save(results, args["results"])  # after each case: a crash in the next keeps this one
"""


def test_offsets_beyond_2_31(sage_backend, metrics, tmp_path):
    """The far end of tensors of more than 2^31 elements is read and written where it lies."""
    for case in BIG_CASES:
        assert max(case.b * case.hq * case.nq, case.b * case.hkv * case.nk) * case.d > 1 << 31, case
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    if free < BIG_FREE_BYTES:
        pytest.skip(f"needs {BIG_FREE_BYTES / GiB:.0f} GiB of free GPU memory, {free / GiB:.1f} GiB free")
    options = {case.name: sage_backend.reference_options(128) for case in BIG_CASES}
    results_path = tmp_path / "results.pt"
    args = {
        "function": sage_backend.function,
        "reference_options": {name: {**o, "pv": o["pv"].value} for name, o in options.items()},
        "cases": [asdict(case) for case in BIG_CASES],
        "sm90": sage_backend.resolve().name == "cuda_sm90",
        "results": str(results_path),
    }
    # The child imports the sageattention this process imported (cwd: no source tree shadows it).
    package_root = str(Path(sageattention.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", _BIG_CHILD, json.dumps(args)], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=BIG_TIMEOUT_S,
    )  # fmt: skip
    results = torch.load(results_path, weights_only=True) if results_path.exists() else {}
    for case in BIG_CASES:
        if case.name not in results:
            pytest.fail(
                f"{sage_backend.name}, {case}: the run did not complete (exit status {proc.returncode})\n"
                f"{proc.stderr[-6000:]}"
            )
        r = results[case.name]
        pv = sage_backend.resolve().pv
        stats = metrics.assert_tight(r["out"], r["ref"], pv, f"{sage_backend.name} {case.name}, far end")
        torch.testing.assert_close(r["lse"], r["ref_lse"], atol=LSE_ATOL, rtol=1e-4)
        print(
            f"\n{sage_backend.name} {case.name}: far end vs sage_ref {metrics.fmt(stats)}; "
            f"peak {r['peak_bytes'] / GiB:.2f} GiB"
        )
    assert proc.returncode == 0, proc.stderr[-6000:]


# --------------------------------------------------------------------------------------------------
# Sizes

SIZES = [
    # (b, hq, hkv, nq, nk, d, causal)
    (1, 1, 1, 1, 1, 64, False),  # one query, one key
    (1, 1, 1, 1, 1, 128, True),
    (1, 1, 1, 2, 3, 64, False),
    (1, 1, 1, 17, 17, 128, True),  # shorter than every tile
    (2, 1, 1, 129, 129, 64, True),  # one past a 128-row tile and two 64-key blocks
    (1, 8, 1, 65, 63, 128, False),  # MQA; lengths around the 64-key block
    (3, 2, 2, 300, 100, 64, True),  # more queries than keys, causal from the top-left corner
    (2, 8, 2, 1, 4097, 128, False),  # decode: one query against long K/V
    (1, 4, 1, 1, 65537, 128, False),  # one query against 64K + 1 keys (a last block of one key)
    (1, 4, 4, 1, 1000, 64, True),  # one causal query sees key 0 only
]


@pytest.mark.parametrize(
    "size", SIZES, ids=lambda s: "b{}_h{}-{}_q{}_k{}_d{}{}".format(*s[:6], "_causal" * s[6])
)
def test_awkward_sizes(sage_backend, mma, metrics, size):
    b, hq, hkv, nq, nk, d, causal = size
    dtype = torch.float16 if nk % 2 else torch.bfloat16
    q, k, v = qkv(mma, b, hq, hkv, nq, nk, d, seed=nq + nk, layout="NHD", dtype=dtype)
    out, lse = sage_backend.call(q, k, v, is_causal=causal, return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (b, hq, nq)
    options = sage_backend.reference_options(d, shape=(b, hq, nq, nk), causal=causal)
    ref, ref_lse = sage_ref(q, k, v, is_causal=causal, return_lse=True, **options)
    mma.check_tight(metrics, out, ref, sage_backend.resolve().pv, f"{sage_backend.name} {size}")
    torch.testing.assert_close(lse, ref_lse, atol=LSE_ATOL, rtol=1e-4)


# --------------------------------------------------------------------------------------------------
# NaN and Inf

# One element of batch entry 1 is set to NaN or +Inf: Q at (head 3, token 77, channel 5), K or V at
# (K/V head 1, token 150, channel 5); heads 2 and 3 share K/V head 1. Non-causal, smooth-K (the
# default), LSE requested. What each does, read off the kernels (float64 SDPA semantics from
# sageattention.reference.attention_ref for comparison):
#
# * The quantizers take amax with a max that keeps NaN (an integer max of |x|'s bit patterns in
#   csrc/fused/quant.cu and sageattention/triton/quant.py), so a NaN makes its scale NaN. The softmax
#   max skips NaN, but a NaN score still makes P NaN, and the MMAs carry NaN into the output.
# * Q NaN ("like_sdpa"): the row's scale is NaN, every score of the row is NaN: the row is NaN, as in
#   SDPA; nothing else changes.
# * Q +Inf ("like_sdpa"): the row's amax is Inf, so its INT8 values are 0 and its scale Inf; every
#   score is 0 * Inf = NaN and the whole row is NaN, as in SDPA.
# * K NaN ("like_sdpa"): mean(k) of that channel is NaN, so the channel is NaN for every key after
#   smoothing and every key block's scale is NaN: every score of the group is NaN, and so is every
#   row of the group, as in SDPA (a NaN key makes every row's softmax NaN).
# * K +Inf ("group_nan"): mean(k) of the channel is Inf, the smoothed channel -Inf (NaN at the key),
#   so every key block has amax Inf: INT8 K all 0 with scale Inf, every score NaN: the whole group
#   is NaN. SDPA is NaN only on the rows whose score with that key is +Inf (q[channel] > 0).
# * V NaN or +Inf ("like_sdpa"): that output channel is non-finite for every row of the group, as
#   in SDPA (FP16 P·V multiplies the Inf; FP8 P·V's per-channel amax is NaN/Inf, so the channel's
#   scale is too), and nothing else changes: the LSE does not depend on V.
NAN_INF_CASES = {
    ("q", "nan"): "like_sdpa",
    ("q", "inf"): "like_sdpa",
    ("k", "nan"): "like_sdpa",
    ("k", "inf"): "group_nan",
    ("v", "nan"): "like_sdpa",
    ("v", "inf"): "like_sdpa",
}
_POISON_B, _POISON_QH, _POISON_KVH, _POISON_QTOKEN, _POISON_KTOKEN, _POISON_CHANNEL = 1, 3, 1, 77, 150, 5


@pytest.mark.parametrize("tensor,value", list(NAN_INF_CASES), ids=lambda x: x)
def test_nan_and_inf_stay_where_they_are(sage_backend, mma, tensor, value):
    b, hq, hkv, n, d = 3, 4, 2, 200, 64
    group = hq // hkv
    clean = dict(zip("qkv", qkv(mma, b, hq, hkv, n, n, d, seed=30)))
    bad = dict(clean)
    x = clean[tensor].clone()
    head, token = (_POISON_QH, _POISON_QTOKEN) if tensor == "q" else (_POISON_KVH, _POISON_KTOKEN)
    x[_POISON_B, head, token, _POISON_CHANNEL] = math.nan if value == "nan" else math.inf
    bad[tensor] = x

    def run(inputs):
        return sage_backend.call(inputs["q"], inputs["k"], inputs["v"], return_lse=True)

    out, lse = run(bad)
    clean_out, clean_lse = run(clean)

    # Where the poison may act: the row (Q), or the query heads of K/V head 1 (K; V: one channel).
    region = torch.zeros(out.shape, dtype=torch.bool, device=out.device)
    lse_region = torch.zeros(lse.shape, dtype=torch.bool, device=lse.device)
    heads = slice(_POISON_KVH * group, (_POISON_KVH + 1) * group)
    if tensor == "q":
        region[_POISON_B, _POISON_QH, _POISON_QTOKEN] = True
        lse_region[_POISON_B, _POISON_QH, _POISON_QTOKEN] = True
    elif tensor == "k":
        region[_POISON_B, heads] = True
        lse_region[_POISON_B, heads] = True
    else:
        region[_POISON_B, heads, :, _POISON_CHANNEL] = True
    what = f"{sage_backend.name}, {value} in {tensor}"
    assert torch.equal(out[~region], clean_out[~region]), f"{what}: outputs outside {tensor}'s reach changed"
    assert torch.equal(lse[~lse_region], clean_lse[~lse_region]), f"{what}: LSEs outside its reach changed"
    assert not torch.isfinite(lse[lse_region]).any(), f"{what}: the LSE it reaches must be non-finite"

    sdpa_bad = ~torch.isfinite(attention_ref(bad["q"], bad["k"], bad["v"]))
    out_bad = ~torch.isfinite(out)
    kind = NAN_INF_CASES[(tensor, value)]
    if kind == "like_sdpa":
        assert torch.equal(sdpa_bad, region), "the test's own premise: SDPA is non-finite on the region"
        assert torch.equal(out_bad, sdpa_bad), f"{what}: non-finite elsewhere than where SDPA is"
    elif kind == "group_nan":
        assert torch.isnan(out[region]).all(), f"{what}: the whole group must be NaN"
        assert not (sdpa_bad & ~region).any(), "the test's own premise: SDPA is non-finite inside the group"
    else:
        raise AssertionError(f"unknown case {kind}")


# --------------------------------------------------------------------------------------------------
# Determinism

REPEATS = 6


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_repeated_runs_give_the_same_bits(sage_backend, mma, causal):
    """Same inputs, same bits: whatever the addresses the allocator hands out, NaN left in its free
    blocks (an unwritten element shows), and the stream (the last run is on a side stream)."""
    q, k, v = qkv(mma, 2, 8, 2, 1500, 1700, 128, seed=40, layout="NHD")
    first, first_lse = sage_backend.call(q, k, v, is_causal=causal, return_lse=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    for i in range(REPEATS):
        mma.poison_allocator((first.shape, first.dtype), (first_lse.shape, torch.float32))
        shift = torch.empty((i + 1) * 4099, dtype=torch.uint8, device="cuda")  # moves later allocations
        with torch.cuda.stream(side if i == REPEATS - 1 else None):
            out, lse = sage_backend.call(q, k, v, is_causal=causal, return_lse=True)
        torch.cuda.synchronize()
        assert torch.equal(out, first), f"run {i + 2} differs from run 1\n{mma.where_it_differs(out, first)}"
        assert torch.equal(lse, first_lse), f"run {i + 2}: the LSE differs from run 1"
        del shift


# --------------------------------------------------------------------------------------------------
# Streams, host synchronization, threads


def test_runs_on_the_current_stream(sage_backend, mma, hold_stream):
    """With the default stream held by a long sleep, a call on a side stream completes and is right as
    soon as the side stream is: none of its work waited behind the default stream. (Had any of it been
    queued there, the output would hold the warm-up's values: other inputs, the allocator's blocks of
    the side stream.)"""
    warm = qkv(mma, 1, 8, 2, 700, 700, 128, seed=50)
    test = qkv(mma, 1, 8, 2, 700, 700, 128, seed=60)
    expected = sage_backend.call(*test, is_causal=True)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        sage_backend.call(*warm, is_causal=True)
    torch.cuda.synchronize()
    hold_stream()
    with torch.cuda.stream(side):
        out = sage_backend.call(*test, is_causal=True)
        side.synchronize()
        default_busy = not torch.cuda.default_stream().query()
        same = torch.equal(out, expected)  # on the side stream: does not wait for the sleep
    torch.cuda.synchronize()
    assert default_busy, "the default stream finished its sleep first: the call synchronized with it"
    assert same, "the call's result was not complete when its stream was: work went to another stream"


def test_never_blocks_the_host(sage_backend, mma, hold_stream):
    """After warm-up, calls queued behind a long sleep on their own stream return while the GPU still
    sleeps: nothing in them (a .item(), a device-to-host copy, a stream or device synchronize) waits
    for the GPU. torch's sync debug mode turns any synchronizing torch call into an error as well."""
    q, k, v = qkv(mma, 2, 8, 2, 1000, 1000, 128, seed=70)
    variants = [{}, {"is_causal": True, "return_lse": True}]
    if sage_backend.masks:
        gen = torch.Generator(device="cuda").manual_seed(7)
        variants.append({"attn_mask": torch.rand(1000, 1000, device="cuda", generator=gen) > 0.2})
    expected = [sage_backend.call(q, k, v, **kw) for kw in variants]
    torch.cuda.synchronize()
    mode = torch.cuda.get_sync_debug_mode()
    hold_stream()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outs = [sage_backend.call(q, k, v, **kw) for kw in variants]
    finally:
        torch.cuda.set_sync_debug_mode(mode)
    returned_first = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert returned_first, "the calls returned only after the GPU finished the sleep queued before them"
    for kw, out, exp in zip(variants, outs, expected):
        pairs = zip(out, exp) if isinstance(out, tuple) else [(out, exp)]
        assert all(torch.equal(a, b) for a, b in pairs), f"options {sorted(kw)}: result differs"


THREADS = 4
THREAD_CALLS = 10


def test_threads_on_their_own_streams(sage_backend, mma):
    """Four threads call at once, each on its own stream (the first on the default stream), with their
    own inputs and options; every result has the bits of the same call made alone."""
    jobs = [
        (qkv(mma, 1, 4 * (i + 1), 2, 300 + 100 * i, 500, 64, seed=80 + 10 * i), i % 2 == 1)
        for i in range(THREADS)
    ]
    expected = [sage_backend.call(*inputs, is_causal=causal, return_lse=True) for inputs, causal in jobs]
    torch.cuda.synchronize()
    barrier = threading.Barrier(THREADS, timeout=60)

    def work(i):
        inputs, causal = jobs[i]
        stream = torch.cuda.Stream() if i else None
        with torch.cuda.stream(stream):
            barrier.wait()
            outs = [
                sage_backend.call(*inputs, is_causal=causal, return_lse=True) for _ in range(THREAD_CALLS)
            ]
            torch.cuda.current_stream().synchronize()
        return outs

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(work, range(THREADS)))
    for i, outs in enumerate(results):
        for n, (out, lse) in enumerate(outs):
            assert torch.equal(out, expected[i][0]), f"thread {i}, call {n}: output differs"
            assert torch.equal(lse, expected[i][1]), f"thread {i}, call {n}: LSE differs"


# --------------------------------------------------------------------------------------------------
# Memory

#: The caching allocator hands out up to 1 MiB more than asked when the rest of a free block is too
#: small to split (large pool), and a call makes at most 12 allocations (plus the small workspaces of
#: torch's reductions for the K mean and V amax).
ALLOCATOR_SLACK = 16 * MiB


def extra_memory_bound(backend, b, hq, hkv, nq, nk, d, dtype, return_lse, smooth_k=True) -> dict[str, int]:
    """Bytes a call may allocate besides its output and LSE, by item, with Tq = B*Hq*Nq query rows
    and Tk = B*Hkv*Nk key rows, every item counted as live at once:

        INT8 Q            Tq * d_pad                 its scale          Tq * 4
        smooth-K LSE term Tq * 4 (LSE and smooth-K)
        INT8 K            Tk * d_pad * (2 with two K digits: FP16 P·V)
        K scales          B * Hkv * ceil(Nk / key block) * 4
        K mean            B * Hkv * D * 4 (smooth-K)
        V, FP16 P·V       Tk * D * 2 when the input is bf16 (converted), 0 for fp16
        V, FP8 P·V        B * Hkv * d_pad * ceil(Nk / 16) * 16 (transposed e4m3) + 3 * B * Hkv * D * 4
                          (amax, scale, the sm89 FP16-accumulation amax)
        allocator slack   ALLOCATOR_SLACK

    d_pad: the next power of two >= max(D, 32) in the Triton kernels (key block 64 with FP16 P·V, 128
    with FP8), 64 or 128 in the compiled kernels (key block 64 for sm80/sm89, 128 for sm90; head dims
    not a multiple of 8 go to the Triton kernels)."""
    picked = backend.resolve()
    pv = picked.pv
    triton = not picked.compiled or d % 8
    if triton:
        d_pad, key_block = max(32, 1 << (d - 1).bit_length()), 64 if pv is PVDtype.FP16 else 128
    else:
        d_pad, key_block = (64 if d <= 64 else 128), picked.key_block
    tq, tk = b * hq * nq, b * hkv * nk
    items = {
        "int8 q": tq * d_pad,
        "q scale": tq * 4,
        "lse term": tq * 4 if return_lse and smooth_k else 0,
        "int8 k": tk * d_pad * (2 if pv is PVDtype.FP16 else 1),
        "k scales": b * hkv * -(-nk // key_block) * 4,
        "k mean": b * hkv * d * 4 if smooth_k else 0,
    }
    if pv is PVDtype.FP16:
        items["fp16 v"] = tk * d * 2 if dtype == torch.bfloat16 else 0
    else:
        items["fp8 v"] = b * hkv * d_pad * -(-nk // 16) * 16
        items["v scales"] = 3 * b * hkv * d * 4
    items["allocator slack"] = ALLOCATOR_SLACK
    return items


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_extra_memory_is_bounded(sage_backend, mma):
    """Peak device memory of one call minus its inputs and returned tensors, against
    extra_memory_bound (printed, with the measurement)."""
    b, hq, hkv, n, d, dtype = 2, 16, 4, 8192, 128, torch.bfloat16
    q, k, v = qkv(mma, b, hq, hkv, n, n, d, seed=90, dtype=dtype)
    sage_backend.call(q, k, v, return_lse=True)  # warm-up: kernels loaded, dispatch decided
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out, lse = sage_backend.call(q, k, v, return_lse=True)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base - _nbytes(out, lse)
    items = extra_memory_bound(sage_backend, b, hq, hkv, n, n, d, dtype, return_lse=True)
    bound = sum(items.values())
    print(
        f"\n{sage_backend.name} (runs {sage_backend.resolve().name}), "
        f"b={b} hq={hq} hkv={hkv} n={n} d={d} "
        f"bf16: extra {extra / MiB:.1f} MiB, bound {bound / MiB:.1f} MiB = "
        + " + ".join(f"{name} {size / MiB:.2f}" for name, size in items.items() if size)
        + f"; inputs {_nbytes(q, k, v) / MiB:.0f} MiB, output and LSE {_nbytes(out, lse) / MiB:.0f} MiB"
    )
    assert extra <= bound, f"{sage_backend.name}: {extra / MiB:.1f} MiB extra, bound {bound / MiB:.1f} MiB"


GROWTH_CALLS = 2000


def test_no_memory_growth_over_thousands_of_calls(sage_backend, mma):
    q, k, v = qkv(mma, 1, 4, 2, 257, 257, 64, seed=100)
    variants = [{}, {"is_causal": True}, {"return_lse": True}, {"is_causal": True, "return_lse": True}]
    for kw in variants * 3:
        out = sage_backend.call(q, k, v, **kw)
    del out
    torch.cuda.synchronize()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    for i in range(GROWTH_CALLS):
        out = sage_backend.call(q, k, v, **variants[i % len(variants)])
    del out
    torch.cuda.synchronize()
    grown = torch.cuda.memory_allocated() - allocated, torch.cuda.memory_reserved() - reserved
    print(
        f"\n{sage_backend.name}: after {GROWTH_CALLS} calls allocated +{grown[0]} B, reserved +{grown[1]} B"
    )
    assert grown == (0, 0), (
        f"memory grew over {GROWTH_CALLS} calls: allocated +{grown[0]} B, reserved +{grown[1]} B"
    )
