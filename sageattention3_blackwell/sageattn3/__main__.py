"""``python -m sageattn3 selftest``: check what this machine can run against the reference.

On a CPU it checks the reference's self-consistency. On a GPU of sm80 or newer it also runs the
Triton path (quantization bit-exact, attention against the simulated and the float64 reference);
on sm100/sm120 with the compiled extension, the native kernels as well. It says which parts were
verified on this hardware and which are only compiled. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import sys

import torch

from . import __version__, ops, reference
from .reference import attention_ref, fp4_dequantize_ref, fp4_quantize_ref, sage3_ref


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()).clamp_min(1e-300))


def rel_l1(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).abs().sum() / b.abs().sum().clamp_min(1e-300))


class Report:
    def __init__(self) -> None:
        self.failed = 0

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.failed += not ok
        print(f"  [{'pass' if ok else 'FAIL'}] {name}: {detail}", flush=True)


def reference_checks(rep: Report) -> None:
    print("reference (CPU):")
    values = torch.tensor(reference.E2M1_VALUES)
    x = torch.cat([values, -values[1:]]).repeat(2)[:16]
    codes, scales = fp4_quantize_ref(x)
    back = fp4_dequantize_ref(codes, scales)
    rep.check("E2M1 table round trip", torch.equal(back, x), f"scale {float(scales.float()[0])}")
    grid = torch.linspace(0, 500, 20001)
    same = torch.equal(reference.e4m3_round_ref(grid).float(), reference.e4m3_round_bits_ref(grid))
    rep.check("E4M3 rounding (cast vs exponent arithmetic)", same, "20001 values in [0, 500]")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 200, 64, generator=gen) for _ in range(3))
    out = sage3_ref(q, k, v)
    cos = cosine(out, attention_ref(q, k, v))
    rep.check("sage3_ref vs float64 (randn, 1x2x200x64)", cos >= 0.97, f"cosine {cos:.5f}")


def triton_checks(rep: Report, device: torch.device) -> None:
    from . import sageattn3_blackwell
    from .triton import quant

    print("triton path (this GPU):")
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (
        torch.randn(1, 4, 1000, 128, generator=gen, device=device, dtype=torch.bfloat16) for _ in range(3)
    )
    qc, qs, qg, qm = quant.quantize_q(q, True)
    ref = reference.quantize_q_ref(q, q_mean=qm)
    same = (
        torch.equal(qc[:, :, :1000], ref.codes)
        and torch.equal(qs[:, :, :1000], ref.scales.view(torch.uint8))
        and torch.equal(qg, ref.block_scale)
    )
    rep.check("Q quantization bit-exact", same, "1x4x1000x128 bf16")
    vc, vs, vg = quant.quantize_vt(v, 128)
    vref = reference.quantize_v_ref(v)
    same = torch.equal(vc, vref.codes) and torch.equal(vs, vref.scales.view(torch.uint8))
    rep.check("V^T quantization bit-exact", same and torch.equal(vg, vref.block_scale), "1x4x1000x128 bf16")
    for causal in (False, True):
        out = sageattn3_blackwell(q, k, v, is_causal=causal)
        sim = sage3_ref(q.cpu(), k.cpu(), v.cpu(), is_causal=causal)
        exact = attention_ref(q.cpu(), k.cpu(), v.cpu(), is_causal=causal)
        c_sim, c_exact = cosine(out.cpu(), sim), cosine(out.cpu(), exact)
        ok = c_sim >= 0.9995 and not torch.isnan(out).any().item()
        rep.check(
            f"attention causal={causal}",
            ok,
            f"cosine vs sage3_ref {c_sim:.6f}, vs float64 {c_exact:.5f} (sage3_ref vs float64 "
            f"{cosine(sim, exact):.5f}), rel L1 vs float64 {rel_l1(out.cpu(), exact):.4f}",
        )


def native_checks(rep: Report, device: torch.device) -> None:
    major = torch.cuda.get_device_capability(device)[0]
    families = ops.compiled_families()
    print(f"native kernels (compiled for: {', '.join(families) or 'none'}):")
    if not families:
        print(f"  not built in this install ({ops.load_error or 'no Blackwell archs'})")
        return
    here = {10: "sm_100a", 12: "sm_120a"}.get(major)
    if here not in families:
        print(f"  compiled only: this GPU (sm_{major}x) cannot run {', '.join(families)} code")
        return
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(1, 2, 300, 128, generator=gen, device=device, dtype=torch.float16)
    codes, scales, gs, mean = torch.ops.sageattn3.quant_nvfp4_rows(x, 128, 2, None)
    ref = reference.quantize_q_ref(x, q_mean=mean)
    same = torch.equal(codes[:, :, :300], ref.codes) and torch.equal(
        scales[:, :, :300], ref.scales.view(torch.uint8)
    )
    rep.check("native quantization bit-exact", same and torch.equal(gs, ref.block_scale), "1x2x300x128 fp16")
    if here == "sm_120a":
        a = torch.randn(16, 64, generator=gen, device=device)
        b = torch.randn(8, 64, generator=gen, device=device)
        ac, asf = fp4_quantize_ref(a.cpu())
        bc, bsf = fp4_quantize_ref(b.cpu())
        want = fp4_dequantize_ref(ac, asf).double() @ fp4_dequantize_ref(bc, bsf).double().T
        got = torch.ops.sageattn3.mma_nvfp4_smoke(
            ac.to(device), asf.view(torch.uint8).to(device), bc.to(device), bsf.view(torch.uint8).to(device)
        )
        err = float((got.cpu().double() - want).abs().max())
        rep.check(
            "block-scaled FP4 MMA (m16n8k64)", err <= 1e-4 * float(want.abs().max()), f"max abs err {err:.3g}"
        )


def selftest() -> int:
    rep = Report()
    print(f"sageattn3 {__version__}, torch {torch.__version__}")
    reference_checks(rep)
    if not torch.cuda.is_available():
        print("no GPU: the Triton and native kernels were not run (compile checks are in the unit tests)")
    else:
        device = torch.device("cuda")
        cc = torch.cuda.get_device_capability(device)
        print(f"GPU: {torch.cuda.get_device_name(device)} (sm_{cc[0]}{cc[1]})")
        if cc >= (8, 0):
            triton_checks(rep, device)
        else:
            print("triton path: needs sm80 or newer; not run")
        native_checks(rep, device)
    print("result:", "all checks passed" if rep.failed == 0 else f"{rep.failed} check(s) FAILED")
    return 1 if rep.failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sageattn3")
    parser.add_argument("command", choices=["selftest"])
    parser.parse_args(argv)
    return selftest()


if __name__ == "__main__":
    sys.exit(main())
