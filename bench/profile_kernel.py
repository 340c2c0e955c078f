"""One warm call of an implementation at one shape, for a profiler to attach to:

    ncu --kernel-name regex:attn_int8_fp8_sm90 --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --print-details all \
        python bench/profile_kernel.py cuda-sm90 --n 16384

Implementations are bench_attention.py's (IMPLS); the first call compiles and warms, the second is
the one to profile (hence --launch-skip 1).
"""

from __future__ import annotations

import argparse
import sys

import torch
from bench_attention import IMPLS


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("impl", choices=sorted(IMPLS))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    args = ap.parse_args(argv)
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (args.batch, args.heads, args.n, args.d)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    fn = IMPLS[args.impl]()
    for _ in range(2):
        fn(q, k, v, args.causal)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
