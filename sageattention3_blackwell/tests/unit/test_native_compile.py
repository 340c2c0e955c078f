"""The Blackwell CUDA sources compile for sm_100a and sm_120a (nvcc -cubin, no GPU needed), and the
cubins hold the intended instructions: the FP4 conversion on both, the block-scaled MMA on sm_120a."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[2] / "csrc"
# ELF e_flags hold the SM number in bits 8..15 for CUDA cubins of this ABI.
SM_OF = {"100a": 100, "120a": 120}


def nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    found = Path(home) / "bin" / "nvcc"
    return str(found) if found.exists() else shutil.which("nvcc")


def cuobjdump() -> str | None:
    try:
        import triton

        path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if path.exists():
            return str(path)
    except ImportError:
        pass
    return shutil.which("cuobjdump")


@pytest.mark.skipif(nvcc() is None, reason="nvcc not found")
@pytest.mark.parametrize(
    "source,arch,sass",
    [
        ("quant_nvfp4.cu", "100a", "E2M1"),
        ("quant_nvfp4.cu", "120a", "E2M1"),
        ("mma_smoke.cu", "120a", "OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X"),
    ],
)
def test_cubin_for_arch(tmp_path, source, arch, sass):
    out = tmp_path / f"{source}.{arch}.cubin"
    macro = f"-DSAGE3_BUILT_SM{arch.upper()}=1"
    cmd = [
        nvcc(),
        "-std=c++17",
        "-O3",
        "-cubin",
        f"-arch=sm_{arch}",
        macro,
        str(CSRC / source),
        "-o",
        str(out),
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    data = out.read_bytes()
    assert data[:4] == b"\x7fELF"
    e_flags = struct.unpack_from("<I", data, 48)[0]
    assert (e_flags >> 8) & 0xFF == SM_OF[arch], hex(e_flags)
    tool = cuobjdump()
    if tool:
        listing = subprocess.run([tool, "-sass", str(out)], check=True, capture_output=True, text=True).stdout
        assert sass in listing
