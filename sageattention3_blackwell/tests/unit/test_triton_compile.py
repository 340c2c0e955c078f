"""The Triton kernels compile ahead of time for sm80 and sm90 on a machine without a GPU."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("triton.backends.nvidia")

from sageattn3.triton import attention, quant  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

U8, F32 = "*u8", "*fp32"


def compile_for(fn, arch: int, types: dict, consts: dict, **options):
    signature = {name: ("constexpr" if name in consts else types.get(name, "i32")) for name in fn.arg_names}
    src = ASTSource(
        fn=fn, signature=signature, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()}
    )
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


@pytest.mark.parametrize(
    "arch,block_m,warps,head_dim,causal,mask_kind,expect",
    [
        (80, 64, 4, 64, True, 1, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"),
        (90, 128, 8, 128, False, 2, "wgmma.mma_async"),
    ],
)
def test_attention_kernel_compiles(arch, block_m, warps, head_dim, causal, mask_kind, expect):
    # The configurations attention_fp4 launches (BLOCK_M, warps by arch).
    types = {name: U8 for name in ("QC", "QS", "KC", "KS", "VC", "VS")}
    types.update({name: F32 for name in ("QG", "KG", "VG", "CORR", "LSE")})
    types.update(MASK=U8 if mask_kind == 1 else "*bf16", OUT="*bf16", qk_scale="fp32")
    consts = {
        "HEAD_DIM": head_dim,
        "BLOCK_M": block_m,
        "BLOCK_N": 128,
        "IS_CAUSAL": causal,
        "MASK_KIND": mask_kind,
        "HAS_CORR": True,
        "RETURN_LSE": True,
    }
    kernel = compile_for(attention._attn_kernel, arch, types, consts, num_warps=warps, num_stages=2)
    assert expect in kernel.asm["ptx"]
    assert kernel.metadata.shared <= 227 * 1024


def test_quant_kernels_compile():
    # One arch per kernel keeps this test short; they use no arch-specific instructions.
    rows = {"X": "*bf16", "CODES": U8, "SCALES": U8, "GS": F32, "MEAN": F32}
    compile_for(quant._quant_rows_kernel, 80, rows, {"D": 128, "BLOCK": 128, "CHUNK": 32, "MODE": 2})
    vt = {"X": "*fp16", "CODES": U8, "SCALES": U8, "GS": F32}
    compile_for(quant._quant_vt_kernel, 90, vt, {"D": 128, "BLOCK": 128, "CHUNK": 16})
