"""The mma.sync CUDA kernels compile with nvcc without a GPU: csrc/sm80 (INT8 Q·K, FP16 P·V) for sm_80
and sm_90a, csrc/sm89 (INT8 Q·K, FP8 P·V) for sm_89 and sm_90a, and the fused quantization kernels
(csrc/fused) for sm_89.

For each target: no local-memory spills and no stack frame in ``-Xptxas -v`` (a spill in the inner
loop costs more than the MMAs it feeds), and the PTX holds the tensor-core and copy instructions the
kernel is built around (INT8 m16n8k32; FP16 m16n8k16 with FP32 and FP16 accumulators; e4m3
m16n8k32 with FP32 and FP16 accumulators; ldmatrix, cp.async). When a cuobjdump is found (next to
nvcc, on PATH, or inside the triton package), the SASS is checked for the tensor-core instructions
too: IMMA/HMMA everywhere, QMMA (native FP8) on sm_89; sm_90a runs mma.sync e4m3 as FP16 HMMA.
The flags are the package's nvcc flags from build-matrix.yaml. About 45 s on 2 cores.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.cuda_toolchain import NO_NVCC, NVCC, compile_nvcc, cuobjdump, gpu_codes, nvcc_flags

ROOT = Path(__file__).resolve().parents[2]
SM80_SOURCES = sorted((ROOT / "csrc" / "sm80").glob("*.cu"))
SM89_SOURCES = sorted((ROOT / "csrc" / "sm89").glob("*.cu"))
FUSED_SOURCES = sorted((ROOT / "csrc" / "fused").glob("*.cu"))

# family -> (sources, archs to compile, PTX target, instructions its PTX must hold, SASS per arch)
FAMILIES = {
    "sm80": (
        SM80_SOURCES,
        ["sm_80", "sm_90a"],
        "compute_80",
        [
            "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32",
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
            "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16",
            "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
            "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
            "cp.async.cg.shared.global",
        ],
        {"sm_80": ["IMMA.16832.S8.S8", "HMMA.16816.F32"], "sm_90a": ["IMMA.16832.S8.S8", "HMMA.16816.F32"]},
    ),
    "sm89": (
        SM89_SOURCES,
        ["sm_89", "sm_90a"],
        "compute_89",
        [
            "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32",
            "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32",
            "mma.sync.aligned.m16n8k32.row.col.f16.e4m3.e4m3.f16",  # "fp32+fp16" (CUDA >= 12.8)
            "cvt.rn.satfinite.e4m3x2.f32",
            "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
            "cp.async.cg.shared.global",
        ],
        {
            "sm_89": ["IMMA.16832.S8.S8", "QMMA.16832.F32.E4M3.E4M3", "QMMA.16832.F16.E4M3.E4M3"],
            "sm_90a": ["IMMA.16832.S8.S8", "HMMA.16816.F32", "HMMA.16816.F16"],  # e4m3 -> f16, then HMMA
        },
    ),
}


pytestmark = pytest.mark.skipif(NVCC is None, reason=NO_NVCC)


def _nvcc_version() -> tuple[int, int]:
    out = subprocess.run([NVCC, "--version"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"release (\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def _instances(log: str) -> list[tuple[str, tuple[int, int, int], int]]:
    """(kernel, (stack frame, spill stores, spill loads), registers) per compiled entry of -Xptxas -v."""
    out, name, usage = [], None, None
    for line in log.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            name = m.group(1)
        elif m := re.search(
            r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line
        ):
            usage = tuple(int(x) for x in m.groups())
        elif (m := re.search(r"Used (\d+) registers", line)) and name is not None:
            out.append((name, usage, int(m.group(1))))
            name = None
    return out


def test_there_are_mma_kernels():
    assert SM80_SOURCES, "csrc/sm80 holds no .cu file"
    assert SM89_SOURCES, "csrc/sm89 holds no .cu file"


_CASES = [(fam, src, arch) for fam, (srcs, archs, *_) in FAMILIES.items() for src in srcs for arch in archs]
_CASES += [("fused", src, "sm_89") for src in FUSED_SOURCES]


@pytest.mark.parametrize("family,source,arch", _CASES, ids=lambda x: getattr(x, "name", x))
def test_compiles_without_spills(tmp_path, family, source, arch):
    if arch.rstrip("a") not in gpu_codes():  # --list-gpu-code names sm_90, not sm_90a
        pytest.skip(f"this nvcc cannot target {arch}")
    cubin = tmp_path / "k.cubin"
    args = ["-cubin", f"-arch={arch}", "-Xptxas", "-v", *nvcc_flags(), str(source), "-o", str(cubin)]
    log = compile_nvcc(args)
    assert "warning" not in log.lower(), f"nvcc/ptxas warnings for {source.name} ({arch}):\n{log}"
    instances = _instances(log)
    assert instances, f"no kernel was compiled:\n{log}"
    bad = [(name, usage) for name, usage, _ in instances if usage is None or any(usage)]
    assert not bad, f"stack frame or spills ({arch}), (frame, stores, loads): {bad}"
    registers = [r for _, _, r in instances]
    assert max(registers) <= 255, registers
    tool = cuobjdump()
    if tool is None or family == "fused":
        return
    sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True).stdout
    expected = FAMILIES[family][4][arch]
    if family == "sm89" and _nvcc_version() < (12, 8):
        expected = [s for s in expected if ".F16.E4M3" not in s]
    missing = [s for s in expected if s not in sass]
    assert not missing, f"SASS of {source.name} for {arch} lacks {missing}"


@pytest.mark.parametrize(
    "family,source",
    [(f, s) for f, (srcs, *_) in FAMILIES.items() for s in srcs],
    ids=lambda x: getattr(x, "name", x),
)
def test_ptx_uses_the_intended_instructions(tmp_path, family, source):
    _, _, target, expected, _ = FAMILIES[family]
    ptx = tmp_path / "k.ptx"
    compile_nvcc(["-ptx", f"-arch={target}", *nvcc_flags(), str(source), "-o", str(ptx)])
    text = ptx.read_text()
    if family == "sm89" and _nvcc_version() < (12, 8):  # the FP16-accumulating e4m3 MMA is PTX ISA 8.7
        expected = [s for s in expected if ".f16.e4m3" not in s]
    missing = [s for s in expected if s not in text]
    assert not missing, f"{source.name}: PTX lacks {missing}"
    # No arch-specific instruction may leak into these families: the sm80 kernels must run on every
    # arch >= 8.0 (so no FP8 either), the sm89 kernels on every arch >= 8.9.
    forbidden = ["wgmma", "setmaxnreg", "cp.async.bulk", "tcgen05"]
    if family == "sm80":
        forbidden += ["e4m3", "e5m2"]
    for instruction in forbidden:
        assert instruction not in text, f"{source.name}: {instruction} in {family}-family PTX"


@pytest.mark.parametrize("source", SM89_SOURCES, ids=lambda p: p.name)
def test_sm89_builds_without_the_fp16_accumulating_fp8_mma(tmp_path, source):
    """What a CUDA older than 12.8 builds (no PTX ISA 8.7): the "fp32+fp16" instances are left out and
    the launcher reports them as not supported; the FP32-accumulating kernels remain."""
    ptx = tmp_path / "k.ptx"
    compile_nvcc(
        ["-ptx", "-arch=compute_89", "-DSAGE_HAS_MMA_E4M3_F16=0", *nvcc_flags(), str(source), "-o", str(ptx)]
    )
    text = ptx.read_text()
    assert "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32" in text
    assert ".f16.e4m3.e4m3.f16" not in text


def test_sm89_kernels_use_the_same_main_loop_as_sm80():
    """Both families instantiate the one mma.sync kernel of csrc/include/sage_attn_mma.cuh (no copy of
    the main loop per family)."""
    for source in (*SM80_SOURCES, *SM89_SOURCES):
        text = source.read_text()
        assert '#include "sage_attn_mma.cuh"' in text, source.name
        assert "__global__" not in text, f"{source.name} defines its own kernel"


def test_attention_kernels_share_one_copy_of_their_common_pieces():
    """ln 2, neg_inf and OutPair live in csrc/include/sage_attn_common.cuh alone; the mma.sync kernel
    and the sm_90a kernel include it instead of each defining them."""
    common = ROOT / "csrc" / "include" / "sage_attn_common.cuh"
    definitions = (r"constexpr float kLn2\b", r"float neg_inf\(\)", r"struct OutPair\b")
    for source in sorted((ROOT / "csrc").rglob("*.cu*")):
        text = source.read_text()
        for pattern in definitions:
            found = re.search(pattern, text) is not None
            assert found == (source == common), f"{source.relative_to(ROOT)}: {pattern}"
    for user in ("include/sage_attn_mma.cuh", "sm90/attn_int8_fp8.cu"):
        assert '#include "sage_attn_common.cuh"' in (ROOT / "csrc" / user).read_text(), user


def test_fused_quantization_stages_k_partials_by_async_copies(tmp_path):
    """The K blocks of quant_qkv.cu copy their head's chunk partials to shared memory by cp.async, all
    of a thread's copies in flight at once (loaded one L2 round trip at a time into registers, the
    quantization took 4% longer at b=4 h=32 n=16384, bench/NOTES.md)."""
    ptx = tmp_path / "k.ptx"
    source = ROOT / "csrc" / "fused" / "quant_qkv.cu"
    compile_nvcc(["-ptx", "-arch=compute_89", *nvcc_flags(), str(source), "-o", str(ptx)])
    text = ptx.read_text()
    assert "cp.async.cg.shared.global" in text
    assert "cp.async.wait_group 0" in text
