"""Attention throughput, the protocol of README's Speed section: TOPS = 4*b*h*n*n*d / time (halved
when causal), median of triton.testing.do_bench, every implementation in the same run as torch SDPA's
flash and cuDNN backends so the ratios hold on a noisy machine.

    python bench/bench_attention.py                      # b=4 h=32 d=128,64  n=1k..32k  causal and not
    python bench/bench_attention.py --lengths 4096 --batch 1 --heads 24   # one diffusion shape

Writes bench/results/attention-<device>-<date>.json (or --out) and a PNG plot beside it.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import pathlib
import platform
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _sdpa(backend):
    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return run


def _sage(variant: str, **options):
    import sageattention

    fn = getattr(sageattention, variant)

    def run(q, k, v, causal):
        return fn(q, k, v, tensor_layout="HND", is_causal=causal, **options)

    return run


def _sage_kernel_only(pv_name: str):
    """The attention kernel alone, on inputs quantized once outside the timed region."""
    from sageattention.quant import PVDtype
    from sageattention.triton import launch

    pv = PVDtype(pv_name)

    def run(q, k, v, causal):
        return launch.attention_fwd(
            q, k, v, is_causal=causal, sm_scale=q.shape[-1] ** -0.5, pv=pv, smooth_k=True
        )

    return run


def _cuda_sm90():
    """The sm_90a CUDA kernel through its launcher (fused quantization included)."""
    from sageattention.cuda_sm90 import attention_sm90

    def run(q, k, v, causal):
        return attention_sm90(
            q, k, v, is_causal=causal, sm_scale=q.shape[-1] ** -0.5, smooth_k=True, return_lse=False
        )

    return run


IMPLS = {
    "sdpa-flash": lambda: _sdpa(SDPBackend.FLASH_ATTENTION),
    "sdpa-cudnn": lambda: _sdpa(SDPBackend.CUDNN_ATTENTION),
    "sageattn": lambda: _sage("sageattn"),
    "sage-triton-fp8": lambda: _sage("sageattn_qk_int8_pv_fp8_triton"),
    "sage-triton-fp16": lambda: _sage("sageattn_qk_int8_pv_fp16_triton"),
    "launch-triton-fp8": lambda: _sage_kernel_only("fp8"),
    "launch-triton-fp16": lambda: _sage_kernel_only("fp16"),
    "cuda-sm90": _cuda_sm90,
    # the mma.sync kernels (built for sm80 / the sm89 family; on Hopper they run, but only indicatively)
    "sage-cuda-fp16": lambda: _sage("sageattn_qk_int8_pv_fp16_cuda", pv_accum_dtype="fp16+fp32"),
    "sage-cuda-fp16-fp32": lambda: _sage("sageattn_qk_int8_pv_fp16_cuda", pv_accum_dtype="fp32"),
    "sage-cuda-fp8": lambda: _sage("sageattn_qk_int8_pv_fp8_cuda", pv_accum_dtype="fp32+fp16"),
    "sage-cuda-fp8-fp32": lambda: _sage("sageattn_qk_int8_pv_fp8_cuda", pv_accum_dtype="fp32+fp32"),
}


def write_results(
    kind: str, device: str, meta: dict, rows: list, out: pathlib.Path | None = None, tag: str = ""
) -> pathlib.Path:
    """Write {"meta", "rows"} to ``out``, by default bench/results/<kind>-<device>-<date><tag>.json."""
    if out is None:
        slug = device.replace(" ", "_").replace("/", "_")
        out = ROOT / "bench" / "results" / f"{kind}-{slug}-{datetime.date.today().isoformat()}{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"wrote {out}")
    return out


def tops(b, h, n, d, causal, ms):
    flops = 4 * b * h * n * n * d / (2 if causal else 1)
    return flops / (ms * 1e-3) / 1e12


def main(argv=None) -> int:
    import triton.testing

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--head-dims", type=int, nargs="+", default=[128, 64])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    ap.add_argument(
        "--impls",
        nargs="+",
        default=["sdpa-flash", "sdpa-cudnn", "sage-triton-fp8", "sage-triton-fp16"],
        choices=sorted(IMPLS),
    )
    ap.add_argument("--rep", type=int, default=200, help="do_bench repetition time in ms")
    ap.add_argument("--out", type=pathlib.Path, default=None)
    ap.add_argument("--tag", default="", help="suffix of the result file name")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)

    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    runners = {}
    for impl in args.impls:
        try:
            runners[impl] = IMPLS[impl]()
        except (ImportError, AttributeError) as exc:
            print(f"skipping {impl}: {exc}", file=sys.stderr)
    rows = []
    for d in args.head_dims:
        for causal in causals:
            for n in args.lengths:
                gen = torch.Generator(device=dev).manual_seed(n + d)
                shape = (args.batch, args.heads, n, d)
                q, k, v = (
                    torch.randn(shape, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(3)
                )
                line = {"b": args.batch, "h": args.heads, "n": n, "d": d, "causal": causal}
                for impl, fn in runners.items():
                    try:
                        # Compile and warm every kernel first: do_bench sizes its repetitions from the
                        # first call, and a first call that compiles would leave a single timed run.
                        fn(q, k, v, causal)
                        torch.cuda.synchronize()
                        ms = triton.testing.do_bench(
                            functools.partial(fn, q, k, v, causal),
                            warmup=25,
                            rep=args.rep,
                            return_mode="median",
                        )
                    except RuntimeError as exc:  # e.g. a backend that refuses this shape
                        print(f"{impl} n={n} d={d} causal={causal}: {exc}".splitlines()[0], file=sys.stderr)
                        continue
                    line[impl] = round(tops(args.batch, args.heads, n, d, causal, ms), 1)
                rows.append(line)
                cells = "  ".join(f"{i}={line.get(i, '-')}" for i in runners)
                print(f"d={d:3d} causal={int(causal)} n={n:6d}  {cells}", flush=True)
                del q, k, v
                torch.cuda.empty_cache()

    meta = {
        "device": name,
        "capability": ".".join(map(str, torch.cuda.get_device_capability(dev))),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": __import__("triton").__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "unit": "TOPS (4*b*h*n*n*d / time, halved for causal; median of do_bench)",
        "dtype": "bfloat16",
    }
    out = write_results("attention", name, meta, rows, args.out, args.tag)
    if not args.no_plot:
        from plot import plot_results

        print(f"wrote {plot_results(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
