"""Accuracy, the protocol of README's Accuracy section: against float64 attention at b=1 h=8 n=4096
d=128 for `randn` and `outlier` inputs (K + per-channel bias N(0, 8^2), 4 V channels x10, Q x2),
causal and not: cosine similarity, relative L1 (sum|o-r| / sum|r|), RMSE; also against the
simulated-quantization reference (how tightly the kernels do what they claim).

    python bench/accuracy.py [--out bench/results/accuracy-....json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sageattention.quant import PVDtype  # noqa: E402
from sageattention.reference import attention_ref, sage_ref  # noqa: E402


def metrics(out: torch.Tensor, ref: torch.Tensor) -> dict:
    o, r = out.double().flatten(), ref.double().flatten()
    return {
        "cos": torch.nn.functional.cosine_similarity(o, r, dim=0).item(),
        "rel_l1": ((o - r).abs().sum() / r.abs().sum()).item(),
        "rmse": (o - r).pow(2).mean().sqrt().item(),
        "nan": bool(torch.isnan(o).any()),
    }


def make_inputs(kind: str, b=1, h=8, n=4096, d=128, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", generator=gen) for _ in range(3))
    if kind == "outlier":
        k = k + 8 * torch.randn(b, h, 1, d, device="cuda", generator=gen)
        v[..., :4] *= 10
        q = q * 2
    return q.to(dtype), k.to(dtype), v.to(dtype)


def implementations():
    """name -> (options of the simulated reference or None, run(q, k, v, causal))."""
    import sageattention
    from sageattention import extensions
    from sageattention.triton import launch, reference_options

    def triton_impl(pv):
        def run(q, k, v, causal):
            return launch.attention_fwd(
                q, k, v, is_causal=causal, sm_scale=q.shape[-1] ** -0.5, pv=pv, smooth_k=True
            )[0]

        return run

    def compiled(variant, **options):
        fn = getattr(sageattention, variant)
        return lambda q, k, v, causal: fn(q, k, v, tensor_layout="HND", is_causal=causal, **options)

    impls = {f"triton-{pv.value}": (reference_options(pv, 128), triton_impl(pv)) for pv in PVDtype}
    # The compiled kernels' agreement with their simulated quantization is asserted by tests/gpu; here
    # only their float64 figures are reported.
    cuda = {
        "cuda-sm80-fp32": ("sm80", "sageattn_qk_int8_pv_fp16_cuda", {"pv_accum_dtype": "fp32"}),
        "cuda-sm80-fp16+fp32": ("sm80", "sageattn_qk_int8_pv_fp16_cuda", {"pv_accum_dtype": "fp16+fp32"}),
        "cuda-sm89-fp32+fp32": ("sm89", "sageattn_qk_int8_pv_fp8_cuda", {"pv_accum_dtype": "fp32+fp32"}),
        "cuda-sm89-fp32+fp16": ("sm89", "sageattn_qk_int8_pv_fp8_cuda", {"pv_accum_dtype": "fp32+fp16"}),
        "cuda-sm90": ("sm90", "sageattn_qk_int8_pv_fp8_cuda_sm90", {}),
    }
    sm90_gpu = torch.cuda.get_device_capability() == (9, 0)
    for name, (arch, variant, options) in cuda.items():
        if extensions.cuda_unavailable_reason(arch) is None and (arch != "sm90" or sm90_gpu):
            impls[name] = (None, compiled(variant, **options))
    return impls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=pathlib.Path, default=None)
    ap.add_argument("--n", type=int, default=4096)
    args = ap.parse_args(argv)
    results = []
    for kind in ("randn", "outlier"):
        q, k, v = make_inputs(kind, n=args.n)
        for causal in (False, True):
            ref = attention_ref(q, k, v, is_causal=causal)
            for name, (sim_options, fn) in implementations().items():
                out = fn(q, k, v, causal)
                row = {"impl": name, "inputs": kind, "causal": causal, "vs_fp64": metrics(out, ref)}
                a, line = row["vs_fp64"], ""
                if sim_options is not None:
                    sim = sage_ref(q, k, v, is_causal=causal, **sim_options)
                    row["vs_simulated"], row["simulated_vs_fp64"] = metrics(out, sim), metrics(sim, ref)
                    s = row["vs_simulated"]
                    line = f"  sim: cos={s['cos']:.8f} relL1={s['rel_l1']:.2e}"
                results.append(row)
                print(
                    f"{name:20s} {kind:7s} causal={int(causal)}  fp64: cos={a['cos']:.6f} "
                    f"relL1={a['rel_l1']:.4f} rmse={a['rmse']:.2e}{line}",
                    flush=True,
                )
    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "shape": {"b": 1, "h": 8, "n": args.n, "d": 128},
        "dtype": "bfloat16",
    }
    out = args.out or ROOT / "bench" / "results" / f"accuracy-{datetime.date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": results}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
