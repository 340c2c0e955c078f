"""The CUDA toolchain the compile tests (tests/unit/test_cuda_compile*.py) drive without a GPU: where
nvcc and cuobjdump are, the package's nvcc flags from build-matrix.yaml, and one nvcc call."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

from sagebuild import matrix as build_matrix

ROOT = Path(__file__).resolve().parents[1]


def _find_nvcc() -> str | None:
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


#: nvcc from CUDA_HOME, CUDA_PATH, /usr/local/cuda or PATH; None when there is none.
NVCC = _find_nvcc()
NO_NVCC = "nvcc not found (CUDA_HOME, /usr/local/cuda, PATH)"


def cuobjdump() -> str | None:
    """cuobjdump next to nvcc, on PATH, or the copy the triton package ships (found without importing
    triton)."""
    if NVCC is not None and Path(NVCC).with_name("cuobjdump").is_file():
        return str(Path(NVCC).with_name("cuobjdump"))
    if shutil.which("cuobjdump"):
        return shutil.which("cuobjdump")
    spec = importlib.util.find_spec("triton")
    if spec is not None and spec.origin:
        candidate = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if candidate.is_file():
            return str(candidate)
    return None


def nvcc_flags() -> list[str]:
    """The sageattention package's nvcc flags and include folders, as setup.py passes them."""
    package = build_matrix.load(ROOT / build_matrix.MATRIX_FILE).package("sageattention")
    includes = [f"-I{ROOT / d}" for d in package.build.get("include_dirs", [])]
    return ["-std=c++17", *package.build.get("nvcc_flags", []), *includes]


def gpu_codes() -> list[str]:
    """The real targets this nvcc compiles for (``nvcc --list-gpu-code``: sm_90, not sm_90a)."""
    out = subprocess.run([NVCC, "--list-gpu-code"], capture_output=True, text=True, check=True).stdout
    return out.split()


def compile_nvcc(args: list[str]) -> str:
    """Run nvcc; fail the test with its output when it fails. Returns stdout + stderr (ptxas -v)."""
    proc = subprocess.run([NVCC, *args], capture_output=True, text=True)
    assert proc.returncode == 0, f"nvcc {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def host_check_program(folder: Path, source: Path) -> Path:
    """Build a host program that includes a kernel's source to check its host-callable logic (work item
    decoding, launch planning) without a GPU: `source` compiled for sm_90a with the package's flags into
    `folder`. Skips the test without an nvcc that can target sm_90a."""
    import pytest

    if NVCC is None:
        pytest.skip(NO_NVCC)
    if "sm_90" not in gpu_codes():  # --list-gpu-code names sm_90, not sm_90a
        pytest.skip("this nvcc cannot target sm_90a")
    exe = folder / source.stem
    compile_nvcc(["-arch=sm_90a", *nvcc_flags(), str(source), "-o", str(exe)])
    return exe
