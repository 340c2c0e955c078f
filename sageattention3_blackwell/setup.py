"""Build script for sageattn3: the Blackwell extension `sageattn3._C` when it can be built.

`python -m sagebuild build --package sageattn3` calls this through ``python -m build
--no-isolation`` with TORCH_CUDA_ARCH_LIST set; the wheel's local version (``+cu128torch2.9.0``)
comes from sagebuild through setuptools' DIST_EXTRA_CONFIG (``egg_info.tag_build``), never from here.

Environment variables:
  SAGEATTN3_BUILD_CUDA   auto (default): compile when torch with CUDA and nvcc are present;
                         1: compile or fail; 0: pure-Python wheel. SAGEATTENTION_BUILD_CUDA (what
                         sagebuild sets) is read when this one is unset.
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
SOURCES = ["csrc/bindings.cpp", "csrc/quant_nvfp4.cu", "csrc/attn_nvfp4.cu", "csrc/mma_smoke.cu"]
# arch -> (nvcc target, macro telling the sources which families the module holds)
ARCHS = {
    "9.0a": ("90a", "SAGE3_BUILT_SM90A"),
    "10.0a": ("100a", "SAGE3_BUILT_SM100A"),
    "12.0a": ("120a", "SAGE3_BUILT_SM120A"),
}
DEFAULT_ARCHS = "10.0a;12.0a"
PURE_REQUIRES = ["torch>=2.4"]
_BUILD_COMMANDS = {"build", "build_ext", "bdist_wheel", "bdist_egg", "editable_wheel", "install", "develop"}


def note(message: str) -> None:
    print(f"sageattn3 setup: {message}", flush=True)


def stop(message: str) -> None:
    raise SystemExit(f"\nsageattn3 setup: {message}\n")


def build_mode() -> str:
    value = os.environ.get("SAGEATTN3_BUILD_CUDA", os.environ.get("SAGEATTENTION_BUILD_CUDA", "auto"))
    if value not in ("auto", "0", "1"):
        stop(f"SAGEATTN3_BUILD_CUDA={value!r}: use auto, 0 or 1")
    return value


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


def extension_or_reason():
    """(ext_modules, cmdclass, install_requires) or a pure build with the reason noted."""
    mode = build_mode()
    wants_build = any(arg in _BUILD_COMMANDS for arg in sys.argv[1:])
    if mode == "0" or not wants_build:
        return [], {}, PURE_REQUIRES
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension
    except ImportError as exc:
        reason = f"torch is not importable ({exc})"
    else:
        reason = None
        if torch.version.cuda is None:
            reason = f"torch {torch.__version__} has no CUDA"
        elif CUDA_HOME is None or not (Path(CUDA_HOME) / "bin").exists():
            reason = "nvcc not found (set CUDA_HOME)"
    if reason:
        if mode == "1":
            stop(f"cannot build the extension: {reason}")
        note(f"pure-Python build: {reason}")
        return [], {}, PURE_REQUIRES
    archs = requested_archs()
    # No -std flag: torch's build adds the C++ standard its headers need (C++17 or newer).
    nvcc = ["-O3", "--expt-relaxed-constexpr", "-lineinfo"]
    defines = []
    for arch in archs:
        code, macro = ARCHS[arch]
        nvcc += ["-gencode", f"arch=compute_{code},code=sm_{code}"]
        defines.append((macro, "1"))
    threads = os.environ.get("NVCC_THREADS")
    if threads:
        nvcc.append(f"--threads={threads}")
    note(
        f"building sageattn3._C for {', '.join(archs)}: torch {torch.__version__}, CUDA {torch.version.cuda}"
    )
    cxx = ["-O3"] if os.name != "nt" else ["/O2"]
    ext = CUDAExtension(
        name="sageattn3._C",
        sources=SOURCES,
        include_dirs=[str(ROOT / "csrc")],
        define_macros=defines,
        extra_compile_args={"cxx": cxx, "nvcc": nvcc},
    )
    torch_pin = f"torch=={torch.__version__.split('+')[0]}"
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=True)}, [torch_pin]


ext_modules, cmdclass, install_requires = extension_or_reason()
setup(ext_modules=ext_modules, cmdclass=cmdclass, install_requires=install_requires)
