"""Build script for sageattention: CUDA extensions, the torch pin and the {torch}.{cuda} build tag.

What to compile comes from build-matrix.yaml (arch rules and the extension table) through
sagebuild.matrix; this file only turns that data into setuptools objects. The usual way to build a
release wheel is ``python -m sagebuild build``, which prepares a clean environment and calls this.

Environment variables:
  SAGEATTENTION_BUILD_CUDA  auto (default): compile when torch with CUDA and nvcc are present;
                            1: compile or fail; 0: pure-Python wheel (Triton / SDPA at run time).
  TORCH_CUDA_ARCH_LIST      archs to compile, e.g. "8.9;9.0a" (default: the package's default archs
                            that this nvcc can target).
  MAX_JOBS / NVCC_THREADS   parallel compile jobs / nvcc threads per job.
  SAGEATTENTION_BUILD_TAG   wheel build tag to use instead of {torch}.{cuda} ("" for none).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from sagebuild import matrix as build_matrix  # noqa: E402
from sagebuild import tags  # noqa: E402

PACKAGE = "sageattention"
BUILD_INFO = "_build_info.json"
# Commands that build or install; anything else (egg_info, sdist, --version) only describes the project
# and must work without torch, e.g. to make an sdist.
_BUILD_COMMANDS = {
    "build",
    "build_ext",
    "build_py",
    "bdist",
    "bdist_wheel",
    "bdist_egg",
    "dist_info",
    "editable_wheel",
    "install",
    "develop",
}


def note(message: str) -> None:
    print(f"sageattention setup: {message}", flush=True)


def stop(message: str) -> None:
    raise SystemExit(f"\nsageattention setup: {message}\n")


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


def requested_mode() -> str:
    value = os.environ.get("SAGEATTENTION_BUILD_CUDA", "auto").strip().lower()
    if value in ("0", "false", "no", "off"):
        return "pure"
    if value in ("1", "true", "yes", "on"):
        return "cuda"
    if value in ("", "auto"):
        return "auto"
    stop(f"SAGEATTENTION_BUILD_CUDA={value!r}: use auto, 1 or 0")
    return "auto"


def nvcc_version(cuda_home: str) -> tuple[str, str]:
    """(major.minor, full) of CUDA_HOME's nvcc."""
    exe = Path(cuda_home) / "bin" / ("nvcc.exe" if os.name == "nt" else "nvcc")
    try:
        out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        stop(f"cannot run {exe} --version: {exc}")
    match = re.search(r"release (\d+)\.(\d+), V([\d.]+)", out)
    if not match:
        stop(f"cannot read the CUDA version from `{exe} --version`:\n{out}")
    return f"{match.group(1)}.{match.group(2)}", match.group(3)


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
        self.requires = list(self.package.pure_requires)
        self._decide()

    def _decide(self) -> None:
        mode = requested_mode()
        if mode == "pure":
            note("SAGEATTENTION_BUILD_CUDA=0: building the pure-Python package (no CUDA extensions)")
            return
        metadata_only = not _BUILD_COMMANDS.intersection(sys.argv[1:])
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
        self.torch = torch.__version__.split("+")[0]
        self.torch_cuda = torch.version.cuda
        nvcc_cuda, self.nvcc = nvcc_version(CUDA_HOME)
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
        tag = os.environ.get("SAGEATTENTION_BUILD_TAG")
        self.build_tag = tags.build_tag(self.torch, self.torch_cuda) if tag is None else (tag or None)
        self.requires = [f"torch=={self.torch}"]
        self.plans = self.matrix.extension_plan(PACKAGE, self.archs, ROOT)
        note(
            f"torch {torch.__version__}, nvcc {self.nvcc} ({CUDA_HOME}), archs {';'.join(self.archs)}, "
            f"build tag {self.build_tag or '(none)'}"
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
        from torch.utils.cpp_extension import CUDAExtension  # noqa: PLC0415

        flags = self.package.build
        threads = os.environ.get("NVCC_THREADS", "").strip()
        cxx = list(flags.get("msvc_flags" if os.name == "nt" else "cxx_flags", []))
        modules = []
        for plan in built:
            nvcc = list(flags.get("nvcc_flags", []))
            nvcc += [build_matrix.Arch.parse(a).gencode for a in plan.archs]
            if threads:
                nvcc += ["--threads", threads]
            if os.name == "nt":
                nvcc += ["-Xcompiler", "/Zc:__cplusplus"]
            modules.append(
                CUDAExtension(
                    name=plan.name,
                    sources=list(plan.sources),
                    include_dirs=[str(ROOT / d) for d in flags.get("include_dirs", [])],
                    define_macros=[(k, v) for k, v in plan.define.items()],
                    extra_compile_args={"cxx": cxx, "nvcc": nvcc},
                )
            )
        return modules

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
            "extensions": {p.name: list(p.archs) for p in self.plans if not p.skipped},
            "skipped": {p.name: p.skipped for p in self.plans if p.skipped},
        }


CONFIG = BuildConfig()


class PlatformDistribution(Distribution):
    """A CUDA build is a platform wheel even when no extension had sources to compile."""

    def has_ext_modules(self) -> bool:
        return CONFIG.cuda or super().has_ext_modules()


class build_py_with_info(build_py):
    """Writes sageattention/_build_info.json (what was compiled, for which archs) into the build."""

    def run(self) -> None:
        super().run()
        if self.dry_run:
            return
        target = Path(self.build_lib) / PACKAGE / BUILD_INFO
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(CONFIG.build_info(), indent=2, sort_keys=True) + "\n", encoding="utf-8")

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PACKAGE / BUILD_INFO)]


class bdist_wheel_tagged(bdist_wheel):
    """Adds the {torch}.{cuda} build tag unless one was given (--build-number)."""

    def finalize_options(self) -> None:
        if self.build_number is None and CONFIG.build_tag:
            self.build_number = CONFIG.build_tag
        super().finalize_options()


cmdclass = {"build_py": build_py_with_info, "bdist_wheel": bdist_wheel_tagged}
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
