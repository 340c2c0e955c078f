"""The sm_90a CUDA kernel (csrc/sm90) compiles with nvcc for sm_90a without a GPU, and its Vᵀ key
permutation is consistent with the wgmma fragment layouts it is derived from.

Compile checks (skipped without nvcc, or with an nvcc that cannot target sm_90a):

* ``-Xptxas -v``: no local-memory spills and no stack frame in any instantiation, at most the 168
  registers per thread that ``__launch_bounds__(384, 1)`` leaves (65536 / 384, rounded down to 8),
  and no ptxas warning (a wgmma that ptxas has to serialize is reported as one).
* The PTX holds the instructions the kernel is built around: the INT8 and FP8 wgmma shapes,
  wgmma fence/commit/wait, 4-d TMA tile loads completing on mbarriers, setmaxnreg.
* When a cuobjdump is found (next to nvcc, on PATH, or inside the triton package), the SASS holds
  the Hopper tensor-core instructions: IGMMA (INT8) and QGMMA (FP8) warpgroup MMAs, UTMALDG (TMA),
  USETMAXREG.

The flags are the package's nvcc flags from build-matrix.yaml. About 10 s on 2 cores.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from sageattention.reference import permute_keys_sm90
from sagebuild import matrix as build_matrix

ROOT = Path(__file__).resolve().parents[2]
SM90_SOURCES = sorted((ROOT / "csrc" / "sm90").glob("*.cu"))
ARCH = "sm_90a"
MAX_REGISTERS = 168  # __launch_bounds__(384, 1): 65536 / 384 = 170, allocated in units of 8

PTX_EXPECTED = [
    "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8",
    "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3",  # P·V at d_pad = 128
    "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3",  # P·V at d_pad = 64
    "wgmma.fence.sync.aligned",
    "wgmma.commit_group.sync.aligned",
    "wgmma.wait_group.sync.aligned",
    "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
    "mbarrier.try_wait.parity",
    "mbarrier.arrive.expect_tx",
    "setmaxnreg.inc.sync.aligned.u32",
    "setmaxnreg.dec.sync.aligned.u32",
    "cvt.rn.satfinite.e4m3x2.f32",
]
SASS_EXPECTED = [
    "IGMMA.64x128x32.S8.S8",
    "QGMMA.64x128x32.F32.E4M3.E4M3",
    "QGMMA.64x64x32.F32.E4M3.E4M3",
    "UTMALDG.4D",
    "USETMAXREG",
]


def _nvcc() -> str | None:
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


NVCC = _nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (CUDA_HOME, /usr/local/cuda, PATH)")


def _cuobjdump() -> str | None:
    """cuobjdump next to nvcc, on PATH, or the copy the triton package ships (found without
    importing triton)."""
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


def _flags() -> list[str]:
    package = build_matrix.load(ROOT / build_matrix.MATRIX_FILE).package("sageattention")
    includes = [f"-I{ROOT / d}" for d in package.build.get("include_dirs", [])]
    return ["-std=c++17", *package.build.get("nvcc_flags", []), *includes]


def _can_target_sm90a() -> bool:
    out = subprocess.run([NVCC, "--list-gpu-code"], capture_output=True, text=True, check=True).stdout
    return "sm_90" in out.split()  # --list-gpu-code names sm_90, not sm_90a


def _compile(args: list[str]) -> str:
    proc = subprocess.run([NVCC, *args], capture_output=True, text=True)
    assert proc.returncode == 0, f"nvcc {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def test_there_are_sm90_kernels():
    assert SM90_SOURCES, "csrc/sm90 holds no .cu file"


@pytest.fixture(scope="module")
def sm90_builds(tmp_path_factory):
    """{source name: (ptxas log, cubin path, ptx text)}, compiled once for the module."""
    if NVCC is None:
        pytest.skip("nvcc not found (CUDA_HOME, /usr/local/cuda, PATH)")
    if not _can_target_sm90a():
        pytest.skip(f"this nvcc cannot target {ARCH}")
    out = tmp_path_factory.mktemp("sm90")
    builds = {}
    for source in SM90_SOURCES:
        cubin, ptx = out / f"{source.stem}.cubin", out / f"{source.stem}.ptx"
        log = _compile(["-cubin", f"-arch={ARCH}", "-Xptxas", "-v", *_flags(), str(source), "-o", str(cubin)])
        _compile(["-ptx", f"-arch={ARCH}", *_flags(), str(source), "-o", str(ptx)])
        builds[source.name] = (log, cubin, ptx.read_text())
    return builds


@needs_nvcc
@pytest.mark.parametrize("source", [p.name for p in SM90_SOURCES])
def test_compiles_without_spills(sm90_builds, source):
    log, _, _ = sm90_builds[source]
    entries = re.findall(r"Compiling entry function '(\w+)'", log)
    assert entries, f"no kernel was compiled:\n{log}"
    usage = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert len(usage) == len(entries), log
    bad = [(name, u) for name, u in zip(entries, usage) if any(int(x) for x in u)]
    assert not bad, f"stack frame or spills ({ARCH}): {bad}"
    registers = [int(r) for r in re.findall(r"Used (\d+) registers", log)]
    assert registers and max(registers) <= MAX_REGISTERS, registers
    warnings = [line for line in log.splitlines() if "warning" in line.lower()]
    assert not warnings, "ptxas warnings:\n" + "\n".join(warnings)


@needs_nvcc
@pytest.mark.parametrize("source", [p.name for p in SM90_SOURCES])
def test_ptx_uses_the_intended_instructions(sm90_builds, source):
    _, _, ptx = sm90_builds[source]
    missing = [s for s in PTX_EXPECTED if s not in ptx]
    assert not missing, f"{source}: PTX lacks {missing}"


@needs_nvcc
@pytest.mark.parametrize("source", [p.name for p in SM90_SOURCES])
def test_sass_uses_hopper_tensor_cores(sm90_builds, source):
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump found (CUDA toolkit, PATH or the triton package)")
    _, cubin, _ = sm90_builds[source]
    proc = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    missing = [s for s in SASS_EXPECTED if s not in proc.stdout]
    assert not missing, f"{source}: SASS for {ARCH} lacks {missing}"


# --------------------------------------------------------------------------------------------------
# The Vᵀ key permutation against the fragment layouts (csrc/include/sage_wgmma.cuh), simulated.


def _accumulator_coord(warp: int, lane: int, i: int) -> tuple[int, int]:
    """(row, column) of register i of an m64nN FP32/S32 wgmma accumulator."""
    return 16 * warp + lane // 4 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * (lane % 4) + i % 2


def _a_operand_coord(warp: int, lane: int, reg: int, byte: int) -> tuple[int, int]:
    """(row, k) of byte `byte` of register `reg` of an 8-bit m64nNk32 wgmma A fragment."""
    return 16 * warp + lane // 4 + 8 * (reg % 2), 4 * (lane % 4) + byte + 16 * (reg // 2)


def test_permuted_keys_pair_each_p_with_its_own_v_row():
    """One 64-row warpgroup and one 128-key block, as the kernel packs it: the scores a thread holds
    in accumulator order go, unshuffled, into the A registers of the four k32 steps (column tiles
    4kk, 4kk+1 of row `group` into a[0], of row `group + 8` into a[1]; tiles 4kk+2, 4kk+3 into a[2],
    a[3]); B is the permuted Vᵀ. The products must be P @ V exactly."""
    gen = torch.Generator().manual_seed(0)
    rows, keys, channels = 64, 128, 16
    p = torch.randint(-8, 9, (rows, keys), generator=gen).double()
    v = torch.randint(-8, 9, (keys, channels), generator=gen).double()
    vt_perm = permute_keys_sm90(v.T.contiguous())  # [channels, keys], as quant_v_fp8 stores it

    a = torch.full((rows, keys), float("nan"), dtype=torch.float64)  # A as the MMA sees it
    for warp in range(4):
        for lane in range(32):
            acc = [p[_accumulator_coord(warp, lane, i)] for i in range(64)]
            for kk in range(keys // 32):
                x = acc[16 * kk : 16 * kk + 16]
                regs = [
                    (x[0], x[1], x[4], x[5]),
                    (x[2], x[3], x[6], x[7]),
                    (x[8], x[9], x[12], x[13]),
                    (x[10], x[11], x[14], x[15]),
                ]
                for reg, values in enumerate(regs):
                    for byte, value in enumerate(values):
                        row, k = _a_operand_coord(warp, lane, reg, byte)
                        assert torch.isnan(a[row, 32 * kk + k]), "an A element is written twice"
                        a[row, 32 * kk + k] = value
    assert not torch.isnan(a).any(), "an A element is never written"
    torch.testing.assert_close(a @ vt_perm.T, p @ v, rtol=0, atol=0)


def test_permutation_is_the_documented_table():
    slots = permute_keys_sm90(torch.arange(32).view(1, 32))[0].tolist()
    group = [0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15]
    assert slots == group + [16 + t for t in group]
    with pytest.raises(ValueError, match="multiple of 16"):
        permute_keys_sm90(torch.zeros(2, 20))
