"""The CUDA sources compile for sm_90a, sm_100a and sm_120a (nvcc -cubin, no GPU needed), and the
cubins hold the intended instructions: the FP4 conversion on the Blackwell targets, the block-scaled
FP4 MMA in the sm_120a attention kernel, fp16 MMAs in the sm_100a/sm_90a one; no register spills
beyond a few words."""

from __future__ import annotations

import re
import struct
import subprocess

import pytest
from sage3_toolchain import CSRC, NVCC, cuobjdump, run

# ELF e_flags hold the SM number in bits 8..15 for CUDA cubins of this ABI.
SM_OF = {"90a": 90, "100a": 100, "120a": 120}
OMMA = "OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X"
HMMA = "HMMA.16816.F32"
E2M1 = "F2FP.SATFINITE.E2M1"


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize(
    "source,arch,present,absent",
    [
        ("quant_nvfp4.cu", "100a", [E2M1], []),
        ("quant_nvfp4.cu", "120a", [E2M1], []),
        ("quant_nvfp4.cu", "90a", [], [E2M1]),  # no cvt to E2M1 on Hopper: the same rounding in software
        ("attn_nvfp4.cu", "120a", [OMMA, E2M1], [HMMA]),
        ("attn_nvfp4.cu", "100a", [HMMA, E2M1], [OMMA]),
        ("attn_nvfp4.cu", "90a", [HMMA], [OMMA, E2M1]),
        ("mma_smoke.cu", "120a", [OMMA], []),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_cubin_for_arch(tmp_path, source, arch, present, absent):
    out = tmp_path / f"{source}.{arch}.cubin"
    log = run([
        NVCC, "-std=c++17", "-O3", "--expt-relaxed-constexpr", "-cubin", f"-arch=sm_{arch}", "-Xptxas", "-v",
        f"-DSAGE3_BUILT_SM{arch.upper()}=1", f"-I{CSRC}", str(CSRC / source), "-o", str(out),
    ])  # fmt: skip
    data = out.read_bytes()
    assert data[:4] == b"\x7fELF"
    e_flags = struct.unpack_from("<I", data, 48)[0]
    assert (e_flags >> 8) & 0xFF == SM_OF[arch], hex(e_flags)
    # The fp16 path of d=128 sits at the 255-register limit: a few words may spill, not more.
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]
    assert max(spills, default=0) <= 64, log
    tool = cuobjdump()
    if tool:
        listing = subprocess.run([tool, "-sass", str(out)], check=True, capture_output=True, text=True).stdout
        for sass in present:
            assert sass in listing, f"{sass} missing from the {arch} SASS of {source}"
        for sass in absent:
            assert sass not in listing, f"{sass} unexpected in the {arch} SASS of {source}"
