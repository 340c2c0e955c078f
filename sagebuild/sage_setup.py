"""What the setup.py of both packages share: their settings from the environment, nvcc's version, the
CUDA extension of a c-abi module (the static CUDA runtime, the limited API), the build record
``<package>/_build_info.json`` and the wheel's tags.

The repository's setup.py imports it as ``sagebuild.sage_setup``; sageattn3's build copies it next to
its own setup.py (sageattention3_blackwell/shared_sources.py, ``shared_files`` in build-matrix.yaml),
where it is the top-level module ``sage_setup``. So it needs nothing beyond the standard library and
setuptools, imports nothing of sagebuild, and names no package: each setup.py passes its own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import NoReturn

BUILD_INFO = "_build_info.json"
#: Commands that build or install; anything else (egg_info, sdist, --version) only describes the project
#: and must work without torch, e.g. to make an sdist.
BUILD_COMMANDS = frozenset(
    {
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
)
#: The spellings of ``*_BUILD_CUDA``: auto (compile when torch with CUDA and nvcc are present), cuda
#: (compile or fail), pure (a pure-Python wheel).
CUDA_MODES = {
    "": "auto",
    "auto": "auto",
    **dict.fromkeys(("1", "true", "yes", "on"), "cuda"),
    **dict.fromkeys(("0", "false", "no", "off"), "pure"),
}
#: The spellings of ``*_WHEEL``: abi3 (one wheel for every torch from the floor on), pinned (torch==X).
WHEEL_KINDS = {"": "abi3", "abi3": "abi3", "pinned": "pinned"}


def is_build(argv: Iterable[str]) -> bool:
    """Whether setup.py's command line builds or installs (BUILD_COMMANDS)."""
    return not BUILD_COMMANDS.isdisjoint(argv)


class PackageSetup:
    """One package's setup.py: its messages (``note`` prints a line, ``stop`` ends the build with one,
    both naming the package) and the pieces that can fail with such a message."""

    def __init__(self, package: str) -> None:
        self.package = package

    def note(self, message: str) -> None:
        print(f"{self.package} setup: {message}", flush=True)

    def stop(self, message: str) -> NoReturn:
        raise SystemExit(f"\n{self.package} setup: {message}\n")

    def setting(self, names: Iterable[str], default: str, choices: Mapping[str, str], valid: str) -> str:
        """The value of the first of the environment variables ``names`` that is set (else ``default``),
        by its spelling in ``choices``; a spelling not there stops the build, saying what is ``valid``."""
        names = list(names)
        name = next((n for n in names if n in os.environ), names[0])
        spelling = os.environ.get(name, default).strip().lower()
        if spelling not in choices:
            self.stop(f"{name}={spelling!r}: use {valid}")
        return choices[spelling]

    def cuda_mode(self, *names: str) -> str:
        """auto, cuda or pure (CUDA_MODES), from the first of ``names`` that is set."""
        return self.setting(names, "auto", CUDA_MODES, "auto, 1 or 0")

    def wheel_kind(self, *names: str) -> str:
        """abi3 or pinned (WHEEL_KINDS), from the first of ``names`` that is set."""
        valid = "abi3 (one wheel for every torch) or pinned (torch==X)"
        return self.setting(names, "abi3", WHEEL_KINDS, valid)

    def nvcc_version(self, cuda_home: str) -> tuple[str, str]:
        """(major.minor, full) of CUDA_HOME's nvcc."""
        exe = Path(cuda_home) / "bin" / ("nvcc.exe" if os.name == "nt" else "nvcc")
        try:
            out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError) as exc:
            self.stop(f"cannot run {exe} --version: {exc}")
        match = re.search(r"release (\d+)\.(\d+), V([\d.]+)", out)
        if not match:
            self.stop(f"cannot read the CUDA version from `{exe} --version`:\n{out}")
        return f"{match.group(1)}.{match.group(2)}", match.group(3)

    def static_cudart(self, cuda_home: str) -> tuple[list[str], list[str]]:
        """(library dirs, libraries) that link CUDA_HOME's static CUDA runtime: a module then needs no
        libcudart of torch's, nor any other shared library beyond the C/C++ runtime and the driver."""
        home, windows = Path(cuda_home), os.name == "nt"
        name = "cudart_static.lib" if windows else "libcudart_static.a"
        folders = [home / "lib64", home / "lib", home / "lib" / "x64", *sorted(home.glob("targets/*/lib"))]
        for folder in folders:
            if (folder / name).is_file():
                return [str(folder)], ["cudart_static", *([] if windows else ["rt", "pthread", "dl"])]
        self.stop(f"no static CUDA runtime ({name}) under {cuda_home}")

    def cuda_extension(
        self,
        name: str,
        sources: Iterable[str],
        cuda_home: str,
        include_dirs: Iterable[str],
        define_macros: Iterable[tuple[str, str]],
        cxx: Iterable[str],
        nvcc: Iterable[str],
        depends: Iterable[str] = (),
    ):
        """The setuptools Extension of a c-abi module: a plain one, not torch's CUDAExtension, which
        links libtorch, libc10 and torch's libcudart into the module and so ties a wheel to one torch.
        It links CUDA_HOME's static runtime instead, and is a limited-API Python module (py_limited_api:
        an empty module, sage_cabi.h; torch's extension builder compiles with Py_LIMITED_API set to its
        oldest CPython, 3.10 from torch 2.9 on); `sagebuild verify` checks both claims. ``nvcc``: the
        compile flags with the gencodes; NVCC_THREADS and the Windows flags are added here."""
        from setuptools import Extension  # noqa: PLC0415 (only for builds that compile)

        nvcc = list(nvcc)
        threads = os.environ.get("NVCC_THREADS", "").strip()
        if threads:
            nvcc += ["--threads", threads]
        if os.name == "nt":
            nvcc += ["-Xcompiler", "/Zc:__cplusplus"]
        library_dirs, libraries = self.static_cudart(cuda_home)
        return Extension(
            name=name,
            sources=list(sources),
            include_dirs=[*include_dirs, str(Path(cuda_home) / "include")],
            define_macros=list(define_macros),
            extra_compile_args={"cxx": list(cxx), "nvcc": nvcc},
            library_dirs=library_dirs,
            libraries=libraries,
            py_limited_api=True,
            depends=list(depends),
        )

    def build_py_with_info(self, record: Callable[[object], dict]) -> type:
        """A build_py command that also writes <package>/_build_info.json: ``record(distribution)``
        (what was compiled, with which CUDA, for which archs), which the package reads at run time."""
        from setuptools.command.build_py import build_py  # noqa: PLC0415

        package = self.package

        class build_py_with_info(build_py):
            def run(self) -> None:
                super().run()
                if self.dry_run:
                    return
                target = Path(self.build_lib) / package / BUILD_INFO
                target.parent.mkdir(parents=True, exist_ok=True)
                text = json.dumps(record(self.distribution), indent=2, sort_keys=True) + "\n"
                target.write_text(text, encoding="utf-8")

            def get_outputs(self, include_bytecode: bool = True) -> list[str]:
                info = Path(self.build_lib) / package / BUILD_INFO
                return [*super().get_outputs(include_bytecode), str(info)]

        return build_py_with_info

    @staticmethod
    def bdist_wheel_tagged(abi3: str | None, build_tag: str | None = None) -> type:
        """A bdist_wheel command that gives an abi3 wheel its ``cpXY-abi3`` tag (``abi3``: the cpXY of
        the Python floor; None for another wheel) and a pinned wheel its build tag, unless the command
        line gave them (--py-limited-api, --build-number)."""
        from setuptools.command.bdist_wheel import bdist_wheel  # noqa: PLC0415

        class bdist_wheel_tagged(bdist_wheel):
            def finalize_options(self) -> None:
                if abi3 and not self.py_limited_api:
                    self.py_limited_api = abi3
                if self.build_number is None and build_tag:
                    self.build_number = build_tag
                super().finalize_options()

        return bdist_wheel_tagged
