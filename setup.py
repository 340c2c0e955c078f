"""Build script for sageattention: the CUDA modules, the wheel's kind, torch requirement and tags.

What to compile comes from build-matrix.yaml (arch rules, the extension table, the binding) through
sagebuild.matrix; this file only turns that data into setuptools objects. The usual way to build a
release wheel is ``python -m sagebuild build``, which prepares a clean environment and calls this.

The compiled modules talk to Python through a plain C ABI (csrc/bindings.cpp, loaded with ctypes) and
link the CUDA runtime statically: they depend on no torch and no Python version. torch is needed at
build time only for its extension builder (nvcc through ninja), whose CUDA major version must match
nvcc's. What it shares with sageattn3's setup.py (the settings below, nvcc's version, the extension of
a c-abi module, the build record, the wheel's tags) is sagebuild/sage_setup.py.

Environment variables:
  SAGEATTENTION_BUILD_CUDA  auto (default): compile when torch with CUDA and nvcc are present;
                            1: compile or fail; 0: pure-Python wheel (Triton / SDPA at run time).
  SAGEATTENTION_WHEEL       abi3 (default): one wheel for every torch from the matrix's floor on and
                            every CPython from its Python floor on (``cp310-abi3``), ``torch>=FLOOR``;
                            pinned: the seeds' per-torch wheel (``torch==X``, the {torch}.{cuda} build
                            tag, one Python).
  TORCH_CUDA_ARCH_LIST      archs to compile, e.g. "8.9;9.0a" (default: the package's default archs
                            that this nvcc can target).
  MAX_JOBS / NVCC_THREADS   parallel compile jobs / nvcc threads per job.
  SAGEATTENTION_BUILD_TAG   pinned wheels: build tag to use instead of {torch}.{cuda} ("" for none).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from sagebuild import matrix as build_matrix  # noqa: E402
from sagebuild import tags  # noqa: E402
from sagebuild.sage_setup import PackageSetup, is_build  # noqa: E402

PACKAGE = "sageattention"
SETUP = PackageSetup(PACKAGE)
note, stop = SETUP.note, SETUP.stop


def how_to_build(reason: str) -> str:
    return (
        f"{reason}\n"
        "The CUDA extensions are compiled against the installed PyTorch, so pip's isolated build\n"
        "environment (which has no torch) cannot build them. Choose one:\n"
        "  1. a tagged, verified wheel in a clean environment:\n"
        "       python -m sagebuild build            (see docs/building.md)\n"
        "  2. build against the torch you already have:\n"
        "       pip install torch        (the CUDA build you want, e.g. from your CUDA index)\n"
        "       pip install --no-build-isolation .\n"
        "  3. no compiled kernels (Triton / torch SDPA fall-backs at run time):\n"
        "       SAGEATTENTION_BUILD_CUDA=0 pip install ."
    )


class BuildConfig:
    """What this invocation builds: decided once, before setup() runs."""

    def __init__(self) -> None:
        self.matrix = build_matrix.load(ROOT / build_matrix.MATRIX_FILE)
        self.package = self.matrix.package(PACKAGE)
        self.cuda = False
        self.torch = None
        self.torch_cuda = None
        self.nvcc = None
        self.archs: tuple[str, ...] = ()
        self.plans: list[build_matrix.ExtensionPlan] = []
        self.build_tag: str | None = None
        self.cuda_home: str | None = None
        self.wheel = SETUP.wheel_kind("SAGEATTENTION_WHEEL")
        self.binding = self.package.binding
        self.requires = list(self.package.pure_requires)
        self._decide()

    def _decide(self) -> None:
        mode = SETUP.cuda_mode("SAGEATTENTION_BUILD_CUDA")
        if mode == "pure":
            note("SAGEATTENTION_BUILD_CUDA=0: building the pure-Python package (no CUDA extensions)")
            return
        metadata_only = not is_build(sys.argv[1:])
        try:
            import torch  # noqa: PLC0415 (only needed for CUDA builds)
            from torch.utils.cpp_extension import CUDA_HOME  # noqa: PLC0415
        except ImportError:
            if metadata_only:
                return
            stop(how_to_build("PyTorch is not installed in this build environment."))
        if torch.version.cuda is None:
            if mode == "cuda":
                stop(f"SAGEATTENTION_BUILD_CUDA=1 but torch {torch.__version__} is a CPU-only build")
            note(f"torch {torch.__version__} has no CUDA: building the pure-Python package")
            return
        if CUDA_HOME is None:
            if metadata_only:
                return
            stop(
                how_to_build(
                    f"torch {torch.__version__} is a CUDA build but no nvcc was found "
                    "(set CUDA_HOME to a CUDA toolkit, or put nvcc on PATH)."
                )
            )
        self.cuda = True
        self.cuda_home = CUDA_HOME
        self.torch = torch.__version__.split("+")[0]
        self.torch_cuda = torch.version.cuda
        nvcc_cuda, self.nvcc = SETUP.nvcc_version(CUDA_HOME)
        if nvcc_cuda.split(".")[0] != self.torch_cuda.split(".")[0]:
            stop(
                f"nvcc {self.nvcc} (CUDA_HOME={CUDA_HOME}) and torch {torch.__version__} "
                f"(CUDA {self.torch_cuda}) differ in CUDA major version; use a CUDA {self.torch_cuda} toolkit"
            )
        try:
            self.archs, dropped, _ = self.matrix.resolve_archs(
                PACKAGE, nvcc_cuda, os.environ.get("TORCH_CUDA_ARCH_LIST")
            )
        except build_matrix.MatrixError as exc:
            stop(str(exc))
        if dropped:
            note(f"CUDA {nvcc_cuda} cannot target {', '.join(dropped)}: left out")
        if self.wheel == "pinned":
            tag = os.environ.get("SAGEATTENTION_BUILD_TAG")
            self.build_tag = tags.build_tag(self.torch, self.torch_cuda) if tag is None else (tag or None)
            self.requires = [f"torch=={self.torch}"]
            kind = f"pinned to torch=={self.torch}, build tag {self.build_tag or '(none)'}"
        else:
            abi3 = self.package.abi3
            self.requires = [f"torch>={abi3['torch_floor']}"]
            kind = f"abi3 ({tags.abi3_python_tag(abi3['python_floor'])}-abi3), torch>={abi3['torch_floor']}"
        self.plans = self.matrix.extension_plan(PACKAGE, self.archs, ROOT)
        note(
            f"torch {torch.__version__} (build tool only), nvcc {self.nvcc} ({CUDA_HOME}), archs "
            f"{';'.join(self.archs)}, {self.binding} binding, wheel {kind}"
        )
        for plan in self.plans:
            if plan.skipped:
                note(f"skipping {plan.name}: {plan.skipped}")
            else:
                note(f"{plan.name}: {len(plan.sources)} sources, SASS for {';'.join(plan.archs)}")

    def ext_modules(self) -> list:
        built = [p for p in self.plans if not p.skipped]
        if not built:
            if self.cuda:
                note("no extension has sources: the wheel holds the Python package only")
            return []
        flags = self.package.build
        cxx = flags.get("msvc_flags" if os.name == "nt" else "cxx_flags", [])
        include_dirs = [str(ROOT / d) for d in flags.get("include_dirs", [])]
        return [
            SETUP.cuda_extension(
                plan.name,
                plan.sources,
                self.cuda_home,
                include_dirs=include_dirs,
                define_macros=plan.define.items(),
                cxx=cxx,
                nvcc=[
                    *flags.get("nvcc_flags", []),
                    *(build_matrix.Arch.parse(a).gencode for a in plan.archs),
                ],
            )
            for plan in built
        ]

    def build_info(self) -> dict:
        return {
            "package": PACKAGE,
            "version": self.matrix.package_version(PACKAGE),
            "cuda_build": self.cuda,
            "torch": self.torch,
            "torch_cuda": self.torch_cuda,
            "nvcc": self.nvcc,
            "archs": list(self.archs),
            "build_tag": self.build_tag,
            "wheel_kind": self.wheel if self.cuda else "pure",
            "binding": self.binding if self.cuda else None,
            "cuda_line": self.torch_cuda.split(".")[0] if self.cuda else None,
            "torch_floor": self.package.abi3["torch_floor"] if self.cuda and self.wheel == "abi3" else None,
            "extensions": {p.name: list(p.archs) for p in self.plans if not p.skipped},
            "skipped": {p.name: p.skipped for p in self.plans if p.skipped},
        }


CONFIG = BuildConfig()


class PlatformDistribution(Distribution):
    """A CUDA build is a platform wheel even when no extension had sources to compile."""

    def has_ext_modules(self) -> bool:
        return CONFIG.cuda or super().has_ext_modules()


# sageattention/_build_info.json (what was compiled, for which archs); an abi3 wheel's ``cp310-abi3``
# tag, or a pinned wheel's {torch}.{cuda} build tag.
abi3_tag = None
if CONFIG.cuda and CONFIG.wheel == "abi3":
    abi3_tag = tags.abi3_python_tag(CONFIG.package.abi3["python_floor"])
cmdclass = {
    "build_py": SETUP.build_py_with_info(lambda distribution: CONFIG.build_info()),
    "bdist_wheel": SETUP.bdist_wheel_tagged(abi3_tag, CONFIG.build_tag),
}
ext_modules = CONFIG.ext_modules()
if ext_modules:
    from torch.utils.cpp_extension import BuildExtension  # noqa: E402

    cmdclass["build_ext"] = BuildExtension

setup(
    install_requires=CONFIG.requires,
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    distclass=PlatformDistribution,
)
