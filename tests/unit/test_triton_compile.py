"""The Triton kernels compile for every target they serve, on a machine without a GPU.

Triton compiles ahead of time for a named target with its own ptxas, so CI catches front-end and
lowering errors (and checks that the intended tensor-core instructions are emitted) before any
GPU run.
"""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("triton.backends.nvidia")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sageattention.quant import PVDtype  # noqa: E402
from sageattention.triton import attention, backward, launch, quant  # noqa: E402


def compile_for(fn, arch: int, types: dict, consts: dict, **options):
    signature = {name: ("constexpr" if name in consts else types.get(name, "i32")) for name in fn.arg_names}
    src = ASTSource(
        fn=fn, signature=signature, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()}
    )
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def attn_types(fp8: bool, mask_kind: int) -> dict:
    ptr = {
        "Q": "i8",
        "K": "i8",
        "KR": "i8",
        "V": "fp8e4nv" if fp8 else "fp16",
        "QS": "fp32",
        "KS": "fp32",
        "VS": "fp32",
        "OUT": "bf16",
        "LSE": "fp32",
        "CORR": "fp32",
        "MASK": "u8" if mask_kind == 1 else "bf16",
        "cu_q": "i32",
        "cu_k": "i32",
    }
    return {k: "*" + v for k, v in ptr.items()}


CASES = [
    # arch, fp8, causal, mask kind, varlen, head dim, expected PTX
    (
        80,
        False,
        False,
        0,
        False,
        128,
        ["m16n8k32.row.col.satfinite.s32.s8.s8", "m16n8k16.row.col.f32.f16.f16.f32"],
    ),
    (89, True, True, 1, False, 64, ["e4m3.e4m3"]),
    (90, True, False, 2, False, 128, ["wgmma.mma_async", ".s8.s8", "e4m3.e4m3"]),
    (90, True, True, 0, True, 72, ["wgmma.mma_async"]),
    (90, False, True, 0, False, 128, ["wgmma.mma_async", ".s8.s8"]),
]


@pytest.mark.parametrize("arch,fp8,causal,mask_kind,varlen,head_dim,expect", CASES)
def test_attention_kernel_compiles(arch, fp8, causal, mask_kind, varlen, head_dim, expect):
    d_pad = max(32, triton.next_power_of_2(head_dim))
    pv = PVDtype.FP8 if fp8 else PVDtype.FP16
    config = dict(launch._launch_config((arch // 10, arch % 10), d_pad, pv, causal))  # what the launcher uses
    consts = {
        "HEAD_DIM": head_dim,
        "BLOCK_M": config.pop("block_m"),
        "BLOCK_N": 128 if fp8 else 64,
        "D_PAD": d_pad,
        "PV_FP8": fp8,
        "IS_CAUSAL": causal,
        "MASK_KIND": mask_kind,
        "VARLEN": varlen,
        "RETURN_LSE": not varlen,
        "LSE_CORR": not varlen,
        "K_RESIDUAL": not fp8,  # the FP16 P·V path reads K as two INT8 digits
    }
    if not fp8:
        expect = [*expect, "mul.lo.s32"]  # 254 * (q . k1) before the second digit's MMA adds q . k2
    else:
        consts["KR"] = None
    if mask_kind == 0:
        consts["MASK"] = None
    kernel = compile_for(
        attention._attn_kernel,
        arch,
        attn_types(fp8, mask_kind),
        consts,
        **config,
    )
    ptx = kernel.asm["ptx"]
    for needle in expect:
        assert needle in ptx, f"{needle!r} missing from the sm_{arch} PTX"
    assert kernel.metadata.shared <= 227 * 1024


@pytest.mark.parametrize("varlen", [False, True])
def test_quant_kernels_compile(varlen):
    bf16, f32, i8, i32 = "*bf16", "*fp32", "*i8", "*i32"
    compile_for(
        quant._quant_q_kernel,
        90,
        {
            "X": bf16,
            "XQ": i8,
            "XS": f32,
            "KM": f32,
            "CORR": f32,
            "cu_seqlens": i32,
            "scale_mul": "fp32",
            "sm_scale": "fp32",
        },
        {"BLOCK": 64, "D_PAD": 128, "VARLEN": varlen, "WITH_CORR": not varlen},
    )
    compile_for(
        quant._quant_k_kernel,
        90,
        {"X": bf16, "XQ": i8, "XR": i8, "XS": f32, "KM": f32, "cu_seqlens": i32},
        {"BLOCK": 64, "D_PAD": 128, "VARLEN": varlen, "SMOOTH": True, "RESIDUAL": not varlen},
    )
    compile_for(
        quant._quant_v_fp8_kernel,
        89,
        {"X": bf16, "VT": "*fp8e4nv", "VMAX": f32, "cu_seqlens": i32},
        {"BLOCK": 64, "D_PAD": 128, "VARLEN": varlen},
    )
    if varlen:
        compile_for(
            quant._seq_stats_kernel,
            90,
            {"K": bf16, "V": bf16, "KM": f32, "VMAX": f32, "cu_seqlens": i32},
            {"BLOCK": 64, "D_PAD": 128, "SMOOTH": True, "V_AMAX": True},
        )


def backward_types(fn, quant: bool) -> dict:
    """Pointer and float argument types of a backward kernel (Q and K are INT8 when quant)."""
    kinds = {
        "*i8": ("QT", "KT", "XQ", "XT") + (("Q", "K") if quant else ()),
        "*bf16": ("V", "DO", "DQ", "DK", "DV", "OUT", "X") + (() if quant else ("Q", "K")),
        "*fp32": ("LSE2", "DELTA", "KMEAN", "MEAN", "DLSE", "QS", "KS", "LSE", "SCALE"),
        "*u8": ("MASK",),
        "*i32": ("cu_q", "cu_k"),
        "fp32": ("qk_scale", "sm_scale"),
    }
    return {name: t for t, names in kinds.items() for name in names if name in fn.arg_names}


@pytest.mark.parametrize("quant", [False, True], ids=["bf16", "int8"])
@pytest.mark.parametrize("kernel", ["_dq_kernel", "_dkdv_kernel", "_lse_kernel"])
def test_backward_kernels_compile(kernel, quant):
    """The gradient kernels lower to wgmma on sm90: BF16 products, and INT8 ones for the quantized
    backward's Q·Kᵀ, dS·K and dSᵀ·Q (its operands stored K-major for that)."""
    fn = getattr(backward, kernel)
    tiles = backward.block_config(128, quant)
    block_m, block_n, warps, stages = tiles["dkdv" if kernel == "_dkdv_kernel" else "dq"]
    consts = {"HEAD_DIM": 128, "BLOCK_M": block_m, "BLOCK_N": block_n, "D_PAD": 128, "IS_CAUSAL": True,
              "MASK_KIND": 1, "VARLEN": False, "QUANT": quant}  # fmt: skip
    if "HAS_DLSE" in fn.arg_names:
        consts["HAS_DLSE"] = True
    compiled = compile_for(fn, 90, backward_types(fn, quant), consts, num_warps=warps, num_stages=stages)
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx
    assert (".s32.s8.s8" in ptx) == quant, "INT8 products where (and only where) the backward is quantized"
    if kernel != "_lse_kernel":
        assert ".f32.bf16.bf16" in ptx  # dO·Vᵀ (and Pᵀ·dO) in 16 bits either way


def test_backward_quant_kernel_compiles():
    fn = backward._quant_kernel
    compile_for(fn, 90, backward_types(fn, True), {"HEAD_DIM": 72, "BLOCK": 64, "D_PAD": 128, "CENTER": True,
                                                   "SHIFT": True})  # fmt: skip


@pytest.mark.parametrize("shift", [False, True], ids=["k", "q"])
def test_center_kernel_compiles(shift):
    fn = backward._center_kernel
    types = {**backward_types(fn, False), "OUT": "*fp32" if shift else "*bf16"}  # the shifted LSE, or K
    compile_for(fn, 90, types, {"HEAD_DIM": 128, "BLOCK": 64, "D_PAD": 128, "SHIFT": shift})
