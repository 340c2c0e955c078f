"""Every quantized entry point (conftest's ``sage_backend``) on a machine with two GPUs of one kind:

* tensors on cuda:1 while cuda:0 is current work with no ``set_device`` by the caller: the result
  lands on cuda:1, the current device stays cuda:0, nothing is allocated on cuda:0, and the bits are
  those of the same call on cuda:0;
* the call runs on the current stream of the tensors' device (not on the current device's, not on
  a default stream), shown with both default streams held by a long sleep;
* threads drive both GPUs at once, on side streams and on the default streams, with correct results.

Skipped with fewer than two GPUs. A few seconds on two H200s (plus Triton compiling on a cold cache).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from sageattention.reference import sage_ref

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if torch.cuda.device_count() < 2:
    pytest.skip(f"needs two GPUs, this machine has {torch.cuda.device_count()}", allow_module_level=True)

DEV0, DEV1 = torch.device("cuda", 0), torch.device("cuda", 1)
#: Same model, same kernels: the same inputs must give the same bits on both GPUs.
SAME_MODEL = torch.cuda.get_device_name(0) == torch.cuda.get_device_name(1)


@pytest.fixture(autouse=True)
def _device_0_current(sage_backend):
    """cuda:0 is current (as in a fresh process) and GPU 1 can run what the fixture found on GPU 0."""
    if torch.cuda.get_device_capability(1) != torch.cuda.get_device_capability(0):
        pytest.skip("the two GPUs are of different archs")
    torch.cuda.set_device(0)
    yield
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)


def qkv(mma, device, b, hq, hkv, n, d, seed):
    """q, k, v [B, H, N, D] views of NHD bf16 memory on ``device`` (made on cuda:0, then copied)."""
    made = (mma.make(b, h, n, d, "NHD", torch.bfloat16, seed + i) for i, h in enumerate((hq, hkv, hkv)))
    return tuple(x.to(device) for x in made)


def test_non_default_device_without_set_device(sage_backend, mma, metrics):
    q0, k0, v0 = qkv(mma, DEV0, 2, 8, 2, 777, 128, seed=1)
    q1, k1, v1 = (x.to(DEV1) for x in (q0, k0, v0))
    expected, expected_lse = sage_backend.call(q0, k0, v0, is_causal=True, return_lse=True)
    torch.cuda.synchronize(0)
    torch.cuda.reset_peak_memory_stats(0)
    allocated0 = torch.cuda.memory_allocated(0)
    for _ in range(2):  # the first call also loads the kernels onto GPU 1
        out, lse = sage_backend.call(q1, k1, v1, is_causal=True, return_lse=True)
    torch.cuda.synchronize(1)
    assert torch.cuda.current_device() == 0, "the call changed the current device"
    assert out.device == DEV1 and lse.device == DEV1, (out.device, lse.device)
    assert torch.cuda.max_memory_allocated(0) == allocated0, "the call allocated memory on GPU 0"
    ref, ref_lse = sage_ref(
        q1, k1, v1, is_causal=True, return_lse=True, **sage_backend.reference_options(128)
    )
    mma.check_tight(metrics, out, ref, sage_backend.resolve().pv, f"{sage_backend.name} on cuda:1")
    torch.testing.assert_close(lse, ref_lse, atol=1e-2, rtol=1e-4)
    if SAME_MODEL:
        assert torch.equal(out, expected.to(DEV1)), "cuda:1 and cuda:0 gave different bits"
        assert torch.equal(lse, expected_lse.to(DEV1)), "cuda:1 and cuda:0 gave different LSEs"


def test_runs_on_the_current_stream_of_the_tensors_device(sage_backend, mma, hold_stream):
    """cuda:0 current, cuda:1's current stream a side stream s1, both GPUs' default streams held by a
    long sleep: the call on cuda:1 tensors is complete and right as soon as s1 is. (Work queued on
    either default stream would wait for its sleep; the output would then hold the warm-up's values.)"""
    warm = qkv(mma, DEV1, 1, 8, 2, 700, 128, seed=10)
    test = qkv(mma, DEV1, 1, 8, 2, 700, 128, seed=20)
    expected = sage_backend.call(*test, is_causal=True)
    torch.cuda.synchronize(1)
    s1 = torch.cuda.Stream(device=DEV1)
    with torch.cuda.stream(s1), torch.cuda.device(0):  # cuda:1's current stream is s1, cuda:0 current
        sage_backend.call(*warm, is_causal=True)
    torch.cuda.synchronize(1)
    for device in (DEV0, DEV1):
        hold_stream(device)  # that device's default stream
    with torch.cuda.stream(s1):
        with torch.cuda.device(0):
            assert torch.cuda.current_device() == 0 and torch.cuda.current_stream(DEV1) == s1
            out = sage_backend.call(*test, is_causal=True)
        s1.synchronize()
        busy = [not torch.cuda.default_stream(device).query() for device in (DEV0, DEV1)]
        same = torch.equal(out, expected)  # on s1: does not wait for the sleeps
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    assert all(busy), f"a default stream finished its sleep first (busy: {busy}): the call synchronized"
    assert same, "the result was not complete when s1 was: work went to another stream"


THREAD_CALLS = 10


def test_both_gpus_at_once_from_threads(sage_backend, mma):
    """Four threads: per GPU one on a side stream, one with no stream or device set at all (so for
    cuda:1 the current device is cuda:0 and the call must go to cuda:1's default stream)."""
    jobs = [(device, side) for device in (DEV0, DEV1) for side in (True, False)]
    inputs = [
        qkv(mma, device, 1, 8, 2, 600 + 50 * i, 64, seed=30 + 10 * i) for i, (device, _) in enumerate(jobs)
    ]
    expected = [sage_backend.call(*x, is_causal=True, return_lse=True) for x in inputs]
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    barrier = threading.Barrier(len(jobs), timeout=60)

    def work(i):
        device, side = jobs[i]
        stream = torch.cuda.Stream(device=device) if side else None
        with torch.cuda.stream(stream):
            barrier.wait()
            outs = [
                sage_backend.call(*inputs[i], is_causal=True, return_lse=True) for _ in range(THREAD_CALLS)
            ]
        (stream if stream is not None else torch.cuda.default_stream(device)).synchronize()
        return outs

    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(work, range(len(jobs))))
    for i, outs in enumerate(results):
        for n, (out, lse) in enumerate(outs):
            what = f"thread {i} ({jobs[i][0]}, {'side' if jobs[i][1] else 'default'} stream), call {n}"
            assert out.device == jobs[i][0], f"{what}: output on {out.device}"
            assert torch.equal(out, expected[i][0]), f"{what}: output differs"
            assert torch.equal(lse, expected[i][1]), f"{what}: LSE differs"
