"""The CUDA toolchain the sageattn3 compile and emulation tests use without a GPU: nvcc, cuobjdump, the
CUDA headers, a host C++ compiler, and the kernels built for the CPU (tests/emulation/)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

# nvcc and cuobjdump are found as for sageattention's compile tests (one definition, tests/cuda_toolchain.py).
from tests.cuda_toolchain import NVCC, cuobjdump  # noqa: F401 - re-exported to the sageattn3 tests

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
CSRC = PACKAGE_ROOT / "csrc"
EMULATION = PACKAGE_ROOT / "tests" / "emulation"

#: g++ (or $CXX) for the emulation build.
CXX = os.environ.get("CXX") or shutil.which("g++")


def cuda_include() -> Path | None:
    """The CUDA headers next to nvcc (cuda_fp16.h and friends); None when not found."""
    if NVCC is None:
        return None
    for bin_dir in (Path(NVCC).parent, Path(NVCC).resolve().parent):
        cuda = bin_dir.parent
        for candidate in (cuda / "include", cuda / "targets" / "x86_64-linux" / "include"):
            if (candidate / "cuda_fp16.h").is_file():
                return candidate
    return None


def run(cmd: list[str]) -> str:
    """Run a compiler; fail the test with its output when it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def build_emulation(out_dir: Path, fp4_mma: bool) -> Path:
    """The kernels compiled for the CPU (tests/emulation/emulate.cpp): the sm_120a code when
    `fp4_mma`, else the sm_90a code (the sm_100a code differs only by the E2M1 cvt instruction,
    whose emulation is the software rounding)."""
    include = cuda_include()
    assert CXX is not None and include is not None
    lib = out_dir / f"sage3_emulation_{'fp4' if fp4_mma else 'f16'}.so"
    defines = ["-DSAGE3_HAS_MMA_BLOCK_SCALE=1", "-DSAGE3_HAS_FP4_CVT=1"] if fp4_mma else []
    run([
        CXX, "-std=c++20", "-O2", "-shared", "-fPIC", "-pthread", "-ffp-contract=off", "-Wall",
        "-Wno-unknown-pragmas", f"-I{CSRC}", f"-I{include}", "-include", str(EMULATION / "cuda_emulation.h"),
        *defines, str(EMULATION / "emulate.cpp"), "-o", str(lib),
    ])  # fmt: skip
    return lib
