"""``python -m sageattn3 env``: what this install holds and where it runs (versions, the wheel's build,
the compiled module, each GPU's backend); ``python -m sageattn3 selftest``: check what this machine can
run against the reference.

On a CPU it checks the reference's self-consistency. On a GPU of sm80 or newer it also runs the
Triton path (quantization bit-exact, attention against the simulated and the float64 reference).
When the compiled extension holds code for this GPU (sm_120a on compute capability 12.0, sm_100a on
10.0, or a test build's sm_90a on 9.0) it runs the native kernels the same way: quantization
bit-exact, the FP4 MMA alone (sm_120a), and attention against `sage3_ref` and float64. The summary
says which parts were verified on this hardware and which are only compiled. Exit status 1 when a
check fails.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from . import __version__, ops, reference
from .reference import attention_ref, fp4_dequantize_ref, fp4_quantize_ref, sage3_ref

#: The kernel against `sage3_ref` (the same arithmetic; float32 addition order, hardware exp2 and the
#: bf16/fp16 output rounding differ).
TIGHT_COSINE = {"triton": 0.9995, "native": 0.9999}


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()).clamp_min(1e-300))


def rel_l1(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).abs().sum() / b.abs().sum().clamp_min(1e-300))


class Report:
    def __init__(self) -> None:
        self.failed = 0
        self.verified: list[str] = []
        self.failed_parts: list[str] = []
        self.not_run: list[str] = []

    def check(self, name: str, ok: bool, detail: str) -> bool:
        self.failed += not ok
        print(f"  [{'pass' if ok else 'FAIL'}] {name}: {detail}", flush=True)
        return ok

    def part(self, name: str, ok: bool) -> None:
        (self.verified if ok else self.failed_parts).append(name)


def reference_checks(rep: Report) -> None:
    print("reference (CPU):")
    values = torch.tensor(reference.E2M1_VALUES)
    x = torch.cat([values, -values[1:]]).repeat(2)[:16]
    codes, scales = fp4_quantize_ref(x)
    back = fp4_dequantize_ref(codes, scales)
    ok = rep.check("E2M1 table round trip", torch.equal(back, x), f"scale {float(scales.float()[0])}")
    grid = torch.linspace(0, 500, 20001)
    same = torch.equal(reference.e4m3_round_ref(grid).float(), reference.e4m3_round_bits_ref(grid))
    ok &= rep.check("E4M3 rounding (cast vs exponent arithmetic)", same, "20001 values in [0, 500]")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 200, 64, generator=gen) for _ in range(3))
    out = sage3_ref(q, k, v)
    cos = cosine(out, attention_ref(q, k, v))
    ok &= rep.check("sage3_ref vs float64 (randn, 1x2x200x64)", cos >= 0.97, f"cosine {cos:.5f}")
    rep.part("reference arithmetic (CPU)", ok)


def _quant_checks(rep: Report, quantize_q, quantize_k, quantize_vt, q, k, v, label: str) -> bool:
    """Codes, scales and block scales equal to the reference's, bit for bit."""
    n = q.shape[2]
    qc, qs, qg, qm = quantize_q(q)
    ref = reference.quantize_q_ref(q, q_mean=qm)
    same = torch.equal(qc[:, :, :n], ref.codes) and torch.equal(qs[:, :, :n], ref.scales.view(torch.uint8))
    ok = rep.check(
        f"Q quantization bit-exact ({label})", same and torch.equal(qg, ref.block_scale), str(tuple(q.shape))
    )
    kc, ks, kg, km = quantize_k(k)
    ref = reference.quantize_k_ref(k, k_mean=km)
    same = torch.equal(kc[:, :, :n], ref.codes) and torch.equal(ks[:, :, :n], ref.scales.view(torch.uint8))
    ok &= rep.check(
        f"K quantization bit-exact ({label})", same and torch.equal(kg, ref.block_scale), "smoothed"
    )
    vc, vs, vg = quantize_vt(v)
    ref = reference.quantize_v_ref(v)
    same = torch.equal(vc, ref.codes) and torch.equal(vs, ref.scales.view(torch.uint8))
    return ok & rep.check(
        f"V^T quantization bit-exact ({label})", same and torch.equal(vg, ref.block_scale), ""
    )


def _attention_checks(rep: Report, device: torch.device, kind: str) -> bool:
    """sageattn3_blackwell with the given backend against sage3_ref (tight) and float64 (reported)."""
    import os

    from . import sageattn3_blackwell

    gen = torch.Generator(device=device).manual_seed(2)
    cases = [
        ("1x4x1000x128 bf16", (1, 4, 4, 1000, 1000, 128, torch.bfloat16), {}),
        ("1x4x1000x128 bf16 causal", (1, 4, 4, 1000, 1000, 128, torch.bfloat16), {"is_causal": True}),
        (
            "GQA 8/2 heads, 300x170, d=64, fp16, bool mask",
            (1, 8, 2, 300, 170, 64, torch.float16),
            {"mask": True},
        ),
    ]
    ok = True
    previous = os.environ.get("SAGEATTN3_BACKEND")
    os.environ["SAGEATTN3_BACKEND"] = kind
    try:
        for name, (b, hq, hkv, nq, nk, d, dtype), opts in cases:
            q = torch.randn(b, hq, nq, d, generator=gen, device=device).to(dtype)
            k, v = (torch.randn(b, hkv, nk, d, generator=gen, device=device).to(dtype) for _ in range(2))
            kwargs = {"is_causal": opts.get("is_causal", False)}
            if opts.get("mask"):
                kwargs["attn_mask"] = torch.rand(nq, nk, generator=gen, device=device) > 0.25
            out, lse = sageattn3_blackwell(q, k, v, return_lse=True, **kwargs)
            cpu = {key: (val.cpu() if isinstance(val, torch.Tensor) else val) for key, val in kwargs.items()}
            sim, lse_sim = sage3_ref(q.cpu(), k.cpu(), v.cpu(), return_lse=True, **cpu)
            exact = attention_ref(q.cpu(), k.cpu(), v.cpu(), **cpu)
            out = out.cpu()
            c_sim, c_exact = cosine(out, sim), cosine(out, exact)
            err = float((out.float() - sim).abs().max())
            finite = torch.isfinite(lse_sim)
            lse_err = float((lse.cpu()[finite] - lse_sim[finite]).abs().max())
            good = (
                c_sim >= TIGHT_COSINE[kind]
                and err <= 0.02 * float(sim.abs().max()) + 1e-3
                and lse_err <= 2e-3 * max(1.0, float(lse_sim[finite].abs().max()))
                and not torch.isnan(out).any().item()
            )
            ok &= rep.check(
                f"attention {name}",
                good,
                f"cosine vs sage3_ref {c_sim:.6f} (max err {err:.3g}, LSE err {lse_err:.2g}), vs float64 "
                f"{c_exact:.5f} (sage3_ref vs float64 {cosine(sim, exact):.5f}), rel L1 vs float64 "
                f"{rel_l1(out, exact):.4f}",
            )
    finally:
        if previous is None:
            del os.environ["SAGEATTN3_BACKEND"]
        else:
            os.environ["SAGEATTN3_BACKEND"] = previous
    return ok


def triton_checks(rep: Report, device: torch.device) -> None:
    from .triton import quant

    print("triton path (this GPU):")
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (
        torch.randn(1, 4, 1000, 128, generator=gen, device=device, dtype=torch.bfloat16) for _ in range(3)
    )
    ok = _quant_checks(
        rep,
        lambda x: quant.quantize_q(x, True),
        lambda x: quant.quantize_k(x, 128),
        lambda x: quant.quantize_vt(x, 128),
        q,
        k,
        v,
        "Triton",
    )
    rep.part("Triton NVFP4 quantization", ok)
    rep.part("Triton attention (FP4 decoded to fp16, fp16 MMA)", _attention_checks(rep, device, "triton"))


def native_checks(rep: Report, device: torch.device) -> None:
    families = ops.compiled_families()
    print(f"native kernels (compiled for: {', '.join(families) or 'none'}):")
    if not families:
        print(f"  not built in this install ({ops.load_error or 'no arch compiled'})")
        return
    here = ops.device_family(device)
    for family in families:
        if family != here:
            rep.not_run.append(f"{family} kernels: quantization, attention = {ops.ATTENTION_PATHS[family]}")
    cc = torch.cuda.get_device_capability(device)
    if here is None:
        print(f"  compiled only: this GPU (sm_{cc[0]}{cc[1]}) cannot run {', '.join(families)} code")
        return
    print(f"  this GPU runs the {here} code; attention: {ops.ATTENTION_PATHS[here]}")
    kernels = torch.ops.sageattn3

    def quantize_k(x):
        mean = torch.mean(x, dim=2, dtype=torch.float32)
        return (*kernels.quant_nvfp4_rows(x, 128, 1, mean)[:3], mean)

    gen = torch.Generator(device=device).manual_seed(1)
    ok = True
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = (torch.randn(1, 2, 300, 128, generator=gen, device=device).to(dtype) for _ in range(3))
        ok &= _quant_checks(
            rep,
            lambda x: kernels.quant_nvfp4_rows(x, 128, 2, None),
            quantize_k,
            lambda x: kernels.quant_nvfp4_vt(x, 128),
            q,
            (k.float() + 3.0).to(dtype),
            v,
            f"{here}, {str(dtype).replace('torch.', '')}",
        )
    rep.part(f"{here} NVFP4 quantization kernels", ok)
    if here == "sm_120a":
        a = torch.randn(16, 64, generator=gen, device=device)
        b = torch.randn(8, 64, generator=gen, device=device)
        ac, asf = fp4_quantize_ref(a.cpu())
        bc, bsf = fp4_quantize_ref(b.cpu())
        want = fp4_dequantize_ref(ac, asf).double() @ fp4_dequantize_ref(bc, bsf).double().T
        got = kernels.mma_nvfp4_smoke(
            ac.to(device), asf.view(torch.uint8).to(device), bc.to(device), bsf.view(torch.uint8).to(device)
        )
        err = float((got.cpu().double() - want).abs().max())
        good = rep.check(
            "block-scaled FP4 MMA (m16n8k64, fragment and scale layouts)",
            err <= 1e-4 * float(want.abs().max()),
            f"max abs err {err:.3g}",
        )
        rep.part("sm_120a block-scaled FP4 mma.sync (operand and scale-factor layouts)", good)
    rep.part(
        f"{here} attention kernel: {ops.ATTENTION_PATHS[here]}", _attention_checks(rep, device, "native")
    )


def selftest() -> int:
    rep = Report()
    print(f"sageattn3 {__version__}, torch {torch.__version__}")
    reference_checks(rep)
    if not torch.cuda.is_available():
        print("no GPU: the Triton and native kernels were not run (compile checks are in the unit tests)")
        families = ops.compiled_families()
        rep.not_run += [f"{f} kernels: attention = {ops.ATTENTION_PATHS[f]}" for f in families]
        rep.not_run.append("Triton kernels (no GPU)")
    else:
        device = torch.device("cuda")
        cc = torch.cuda.get_device_capability(device)
        print(f"GPU: {torch.cuda.get_device_name(device)} (sm_{cc[0]}{cc[1]})")
        if cc >= (8, 0):
            triton_checks(rep, device)
        else:
            print("triton path: needs sm80 or newer; not run")
        native_checks(rep, device)
    print("summary:")
    for name in rep.verified:
        print(f"  verified on this machine: {name}")
    for name in rep.failed_parts:
        print(f"  FAILED on this machine:   {name}")
    for name in rep.not_run:
        print(f"  compiled, not run here:   {name}")
    print("result:", "all checks passed" if rep.failed == 0 else f"{rep.failed} check(s) FAILED")
    return 1 if rep.failed else 0


def env() -> int:
    """Print the versions, the wheel's build record, the compiled module's state and each GPU's backend."""
    import ctypes
    import platform

    from .core import choose_backend

    print(f"sageattn3 {__version__} ({os.path.dirname(os.path.abspath(__file__))})")
    print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda})")
    info = ops.build_info()
    if info.get("cuda_build"):
        floor = info.get("torch_floor")
        serves = f"torch >= {floor}" if floor else f"torch {info.get('torch')}"
        archs = ";".join(info.get("archs") or []) or "-"
        print(
            f"wheel: {info.get('wheel_kind')} ({info.get('binding')} binding, {serves}), CUDA "
            f"{info.get('cuda_line')} line, nvcc {info.get('nvcc')}, archs {archs}"
        )
    else:
        print("wheel: no compiled module in its build record (a source tree or a pure-Python wheel)")
    module = ops.library()
    if module is not None:
        driver = module.function("sage_cuda_driver_version", ctypes.c_int, [])()
        families = ", ".join(ops.compiled_families()) or "no target"
        print(
            f"compiled module: {module.path}\n  SASS for {families}; CUDA runtime "
            f"{module.cuda_runtime_version()} (linked in), driver {driver if driver > 0 else 'none found'}"
        )
    else:
        print(f"compiled module: not loaded ({ops.load_error})")
    if not torch.cuda.is_available():
        print("GPUs: none (torch sees no CUDA device): sageattn3_blackwell runs the CPU reference")
        return 0
    for index in range(torch.cuda.device_count()):
        device = torch.device("cuda", index)
        cc = torch.cuda.get_device_capability(device)
        reason = ops.unavailable_reason(device)
        native = "compiled kernels run here" if reason is None else f"compiled kernels do not run: {reason}"
        print(
            f"GPU {index}: {torch.cuda.get_device_name(device)} (sm_{cc[0]}{cc[1]}): backend "
            f"{choose_backend(device)}; {native}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sageattn3")
    parser.add_argument("command", choices=["env", "selftest"])
    args = parser.parse_args(argv)
    return env() if args.command == "env" else selftest()


if __name__ == "__main__":
    sys.exit(main())
