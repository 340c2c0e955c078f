"""Build script for sageattn3: the Blackwell extension `sageattn3._C` when it can be built.

`python -m sagebuild build --package sageattn3` calls this through ``python -m build
--no-isolation`` with TORCH_CUDA_ARCH_LIST and SAGEATTENTION_WHEEL set; a per-torch wheel's local version
(``+cu128torch2.9.0``) and an abi3 wheel's CUDA line (``+cu12``) come from sagebuild through setuptools'
DIST_EXTRA_CONFIG (``egg_info.tag_build``), never from here.

The module talks to Python through the plain C ABI that sageattention's modules export too
(csrc/bindings.cpp, loaded with ctypes by sageattn3/ops.py) and links the CUDA runtime statically: it
depends on no torch and no Python version, so the default wheel is one abi3 wheel per CUDA line
(``cp310-abi3``, ``torch>=2.9.0``) that serves every torch from the floor on. torch is needed at build
time only for its extension builder (nvcc through ninja), whose CUDA major version must match nvcc's.
The package-neutral half of that ABI, and the build pieces this file shares with sageattention's
setup.py (sage_setup.py: the settings below, nvcc's version, the extension, the build record, the abi3
tag), come from the repository (shared_sources.py).

Environment variables:
  SAGEATTN3_BUILD_CUDA   auto (default): compile when torch with CUDA and nvcc are present;
                         1: compile or fail; 0: pure-Python wheel (true/false, yes/no, on/off too).
                         SAGEATTENTION_BUILD_CUDA (what sagebuild sets) is read when this one is unset.
  SAGEATTN3_WHEEL        abi3 (default): one wheel for every torch from TORCH_FLOOR on and every CPython
                         from PYTHON_FLOOR on; pinned: a wheel for the build's torch (``torch==X``, one
                         Python). SAGEATTENTION_WHEEL (what sagebuild sets) is read when this one is unset.
  TORCH_CUDA_ARCH_LIST   archs to compile, from 9.0a, 10.0a and 12.0a (default "10.0a;12.0a"); "10.0"
                         and "12.0" mean the same (the FP4 instructions exist only in the "a" targets).
                         9.0a is not a release arch: it builds the sm_100a attention path (FP4 decoded
                         to fp16, mma.sync) and the quantization kernels for Hopper, where they are tested.
  NVCC_THREADS           nvcc threads per job.

The kernels use inline PTX only; no CUTLASS headers are needed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from shared_sources import sync  # noqa: E402

written = sync(ROOT)  # before the import of sage_setup, one of the files it copies
from sage_setup import PackageSetup, is_build  # noqa: E402

SOURCES = ["csrc/bindings.cpp", "csrc/quant_nvfp4.cu", "csrc/attn_nvfp4.cu", "csrc/mma_smoke.cu"]
# arch -> (nvcc target, macro telling the sources which families the module holds)
ARCHS = {
    "9.0a": ("90a", "SAGE3_BUILT_SM90A"),
    "10.0a": ("100a", "SAGE3_BUILT_SM100A"),
    "12.0a": ("120a", "SAGE3_BUILT_SM120A"),
}
DEFAULT_ARCHS = "10.0a;12.0a"
# The abi3 wheel's floors (build-matrix.yaml, packages.sageattn3.abi3; a unit test keeps them equal):
# 2.9.0, sageattn3's oldest torch; 3.10, what torch's extension builder sets Py_LIMITED_API to.
TORCH_FLOOR = "2.9.0"
PYTHON_FLOOR = "3.10"
PURE_REQUIRES = ["torch>=2.4"]
SETUP = PackageSetup("sageattn3")
note, stop = SETUP.note, SETUP.stop


def requested_archs() -> list[str]:
    raw = os.environ.get("TORCH_CUDA_ARCH_LIST") or DEFAULT_ARCHS
    archs = []
    for item in raw.replace(",", ";").replace(" ", ";").split(";"):
        item = item.strip().replace("+PTX", "")
        if not item:
            continue
        arch = item if item.endswith("a") else item + "a"
        if arch not in ARCHS:
            stop(f"TORCH_CUDA_ARCH_LIST has {item!r}; sageattn3 builds for {', '.join(ARCHS)} only")
        if arch not in archs:
            archs.append(arch)
    return archs


class Build:
    """What this invocation builds, decided once before setup() runs."""

    def __init__(self) -> None:
        self.ext_modules: list = []
        self.requires = list(PURE_REQUIRES)
        self.wheel = SETUP.wheel_kind("SAGEATTN3_WHEEL", "SAGEATTENTION_WHEEL")
        self.info: dict = {"package": "sageattn3", "cuda_build": False, "wheel_kind": "pure", "archs": []}
        mode = SETUP.cuda_mode("SAGEATTN3_BUILD_CUDA", "SAGEATTENTION_BUILD_CUDA")
        if mode == "pure" or not is_build(sys.argv[1:]):
            return
        try:
            import torch  # noqa: PLC0415 (only needed for CUDA builds)
            from torch.utils.cpp_extension import CUDA_HOME  # noqa: PLC0415
        except ImportError as exc:
            reason = f"torch is not importable ({exc})"
        else:
            reason = None
            if torch.version.cuda is None:
                reason = f"torch {torch.__version__} has no CUDA"
            elif CUDA_HOME is None or not (Path(CUDA_HOME) / "bin").exists():
                reason = "nvcc not found (set CUDA_HOME)"
        if reason:
            if mode == "cuda":
                stop(f"cannot build the extension: {reason}")
            note(f"pure-Python build: {reason}")
            return
        self._plan(torch.__version__.split("+")[0], torch.version.cuda, CUDA_HOME)

    def _plan(self, torch_version: str, torch_cuda: str, cuda_home: str) -> None:
        archs = requested_archs()
        nvcc = ["-O3", "--expt-relaxed-constexpr", "-lineinfo"]
        defines = []
        for arch in archs:
            code, macro = ARCHS[arch]
            nvcc += ["-gencode", f"arch=compute_{code},code=sm_{code}"]
            defines.append((macro, "1"))
        self.ext_modules = [
            SETUP.cuda_extension(
                "sageattn3._C",
                SOURCES,
                cuda_home,
                include_dirs=[str(ROOT / "csrc"), str(ROOT / "csrc" / "shared")],
                define_macros=defines,
                cxx=["/O2", "/Zc:__cplusplus"] if os.name == "nt" else ["-O3"],
                nvcc=nvcc,
                depends=["csrc/sage3_kernels.h", "csrc/nvfp4.cuh", "csrc/shared/sage_cabi.h"],
            )
        ]
        if self.wheel == "abi3":
            self.requires = [f"torch>={TORCH_FLOOR}"]
        else:
            self.requires = [f"torch=={torch_version}"]
        _, nvcc_version = SETUP.nvcc_version(cuda_home)
        self.info.update(
            cuda_build=True, torch=torch_version, torch_cuda=torch_cuda, nvcc=nvcc_version, archs=archs,
            wheel_kind=self.wheel, binding="c-abi", cuda_line=torch_cuda.split(".")[0],
            torch_floor=TORCH_FLOOR if self.wheel == "abi3" else None, extensions={"sageattn3._C": archs},
        )  # fmt: skip
        note(
            f"building sageattn3._C for {', '.join(archs)}: torch {torch_version} (build tool only), CUDA "
            f"{torch_cuda}, {self.wheel} wheel, requires {self.requires[0]}"
        )


if written:
    note(f"copied from the repository: {', '.join(written)}")
BUILD = Build()
cmdclass = {
    # sageattn3/_build_info.json (what was compiled, with which CUDA, for which archs; the version with
    # its local part); the abi3 wheel's ``cp310-abi3`` tag (a pinned or pure wheel keeps its own).
    "build_py": SETUP.build_py_with_info(
        lambda distribution: {**BUILD.info, "version": distribution.get_version()}
    ),
    "bdist_wheel": SETUP.bdist_wheel_tagged(
        "cp" + PYTHON_FLOOR.replace(".", "") if BUILD.ext_modules and BUILD.wheel == "abi3" else None
    ),
}
if BUILD.ext_modules:
    from torch.utils.cpp_extension import BuildExtension  # noqa: E402

    cmdclass["build_ext"] = BuildExtension.with_options(use_ninja=True)
setup(ext_modules=BUILD.ext_modules, cmdclass=cmdclass, install_requires=BUILD.requires)
