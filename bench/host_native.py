"""Where an eager sm_90a call's host time goes, layer by layer: the whole ``sageattn`` call (planned: a
signature seen before, HND and NHD; and the first call of a signature, the whole way), the op's Python
function (``cuda_ops.call``), its allocations alone (the fake path), the C ABI call through ctypes with
the outputs already allocated, and the bare C function with its argument arrays already packed. Each is
the host's time per call for a run issued back to back behind a busy GPU (as bench/host_overhead.py
measures). A cProfile of sageattn's calls follows.

    python bench/host_native.py [--calls 300] [--out host-native.json]
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import io
import json
import pstats
import sys
import time

import torch

from sageattention import _native, cuda_ops, dispatch, sageattn
from sageattention.quant import INT8_MAX, LOG2E

SHAPES = [(1, 8, 256, 64), (2, 32, 128, 128), (4, 32, 1024, 128)]


def host_us(fn, calls: int) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)  # the GPU busy for a while: the loop below measures the host alone
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def _shape_rows(lib, b, h, n, d, calls):
    """Host µs per call of each layer for one shape."""
    rows = []
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    sm_scale = d**-0.5
    scale_mul, d_pad = sm_scale * LOG2E / INT8_MAX, 64 if d <= 64 else 128
    op_args = (q, k, v, False, sm_scale, scale_mul, d_pad, True, False, False)
    out, _ = cuda_ops.call("attn_sm90", *op_args)
    size = cuda_ops._workspace(lib, "sage_attn_sm90_workspace_bytes", b, h, h, n, n, d, d_pad, True, False,
                               False, 0)  # fmt: skip
    ws = torch.empty(size, dtype=torch.uint8, device="cuda")
    tensors = (q, k, v, out, None, ws, None, None)  # no LSE, no key lengths, no key order
    ints, floats = (False, d_pad, True, False), (sm_scale, scale_mul)
    words = [w for t in tensors for w in _native._descriptor(t)]
    packed = ((ctypes.c_int64 * len(words))(*words), (ctypes.c_int64 * 4)(*ints),
              (ctypes.c_double * 2)(*floats))  # fmt: skip
    fn, ret = lib.op("attn_sm90"), (ctypes.c_int64 * 4)()
    stream = _native._raw_stream(0)
    qn, kn, vn = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    entries = {
        "sageattn": lambda: sageattn(q, k, v, tensor_layout="HND"),
        "sageattn NHD": lambda: sageattn(qn, kn, vn, tensor_layout="NHD"),
        "sageattn, first call of a signature": lambda: (
            dispatch._plans.clear(),
            sageattn(q, k, v, tensor_layout="HND"),
        ),
        "cuda_ops.call": lambda: cuda_ops.call("attn_sm90", *op_args),
        "allocations only (fake path)": lambda: cuda_ops.attn_sm90(None, *op_args),
        "Library.call (outputs given)": lambda: lib.call("attn_sm90", tensors, ints, floats),
        "C function (arrays packed)": lambda: fn(*packed, stream, ret),
        "raw stream lookup": lambda: _native._raw_stream(0),
    }
    for name, entry in entries.items():
        us = host_us(entry, calls)
        rows.append({"shape": f"b={b} h={h} n={n} d={d}", "entry": name, "host_us": us})
        print(f"b={b} h={h} n={n} d={d}  {name:<30} {us:8.1f} us", flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    lib, reason = _native.load("_qattn_sm90")
    if lib is None:
        raise SystemExit(f"_qattn_sm90: {reason}")
    rows = []
    for shape in SHAPES:
        rows += _shape_rows(lib, *shape, calls=args.calls)
    q, k, v = (torch.randn(1, 8, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(args.calls):
        sageattn(q, k, v, tensor_layout="HND")
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(14)
    print(text.getvalue()[-3500:])
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(
                {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
