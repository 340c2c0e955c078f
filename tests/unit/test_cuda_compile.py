"""The sm80-family CUDA kernels (csrc/sm80) compile with nvcc for sm_80 and sm_90a, without a GPU.

For each target: no local-memory spills and no stack frame in ``-Xptxas -v`` (a spill in the inner
loop costs more than the MMAs it feeds), and the PTX holds the tensor-core and copy instructions the
kernel is built around (INT8 m16n8k32, FP16 m16n8k16 with FP32 and FP16 accumulators, ldmatrix,
cp.async). When cuobjdump is present, the SASS is checked for the IMMA/HMMA instructions too.
The flags are the package's nvcc flags from build-matrix.yaml. About 20 s on 2 cores.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sagebuild import matrix as build_matrix

ROOT = Path(__file__).resolve().parents[2]
SM80_SOURCES = sorted((ROOT / "csrc" / "sm80").glob("*.cu"))
ARCHS = ["sm_80", "sm_90a"]

PTX_EXPECTED = [
    "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32",
    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
    "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16",
    "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
    "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
    "cp.async.cg.shared.global",
]
SASS_EXPECTED = ["IMMA.16832.S8.S8", "HMMA.16816.F32"]


def _nvcc() -> str | None:
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


NVCC = _nvcc()
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found (CUDA_HOME, /usr/local/cuda, PATH)")


def _flags() -> list[str]:
    package = build_matrix.load(ROOT / build_matrix.MATRIX_FILE).package("sageattention")
    includes = [f"-I{ROOT / d}" for d in package.build.get("include_dirs", [])]
    return ["-std=c++17", *package.build.get("nvcc_flags", []), *includes]


def _supported_archs() -> set[str]:
    out = subprocess.run([NVCC, "--list-gpu-code"], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def _compile(args: list[str]) -> str:
    proc = subprocess.run([NVCC, *args], capture_output=True, text=True)
    assert proc.returncode == 0, f"nvcc {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def test_there_are_sm80_kernels():
    assert SM80_SOURCES, "csrc/sm80 holds no .cu file"


@pytest.mark.parametrize("source", SM80_SOURCES, ids=lambda p: p.name)
@pytest.mark.parametrize("arch", ARCHS)
def test_compiles_without_spills(tmp_path, source, arch):
    if arch.rstrip("a") not in _supported_archs():  # --list-gpu-code names sm_90, not sm_90a
        pytest.skip(f"this nvcc cannot target {arch}")
    log = _compile(
        ["-cubin", f"-arch={arch}", "-Xptxas", "-v", *_flags(), str(source), "-o", str(tmp_path / "k.cubin")]
    )
    entries = re.findall(r"Compiling entry function '(\w+)'", log)
    assert entries, f"no kernel was compiled:\n{log}"
    usage = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert len(usage) == len(entries), log
    bad = [(name, u) for name, u in zip(entries, usage) if any(int(x) for x in u)]
    assert not bad, f"stack frame or spills ({arch}): {bad}"
    registers = [int(r) for r in re.findall(r"Used (\d+) registers", log)]
    assert registers and max(registers) <= 255, registers
    cuobjdump = Path(NVCC).with_name("cuobjdump")
    if cuobjdump.is_file() or shutil.which("cuobjdump"):
        tool = str(cuobjdump) if cuobjdump.is_file() else shutil.which("cuobjdump")
        sass = subprocess.run(
            [tool, "-sass", str(tmp_path / "k.cubin")], capture_output=True, text=True
        ).stdout
        missing = [s for s in SASS_EXPECTED if s not in sass]
        assert not missing, f"SASS for {arch} lacks {missing}"


@pytest.mark.parametrize("source", SM80_SOURCES, ids=lambda p: p.name)
def test_ptx_uses_the_intended_instructions(tmp_path, source):
    ptx = tmp_path / "k.ptx"
    _compile(["-ptx", "-arch=compute_80", *_flags(), str(source), "-o", str(ptx)])
    text = ptx.read_text()
    missing = [s for s in PTX_EXPECTED if s not in text]
    assert not missing, f"{source.name}: PTX lacks {missing}"
    # No arch-specific instruction may leak into the sm80 family: it must run on every arch >= 8.0.
    for forbidden in ("wgmma", "setmaxnreg", "cp.async.bulk"):
        assert forbidden not in text, f"{source.name}: {forbidden} in sm80-family PTX"
