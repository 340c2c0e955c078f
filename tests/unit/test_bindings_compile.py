"""The host-side bindings (csrc/bindings.cpp, built once per extension of sageattention with that
extension's family macro; sageattention3_blackwell/csrc/bindings.cpp) compile with the host compiler
under ``-Wall -Werror``: a wheel's build log shows no warning of ours. The families are those of
build-matrix.yaml, the flags those setup.py passes (the package's cxx flags, torch's extension macros,
the limited Python API), and no torch include folder: both packages' modules are of the c-abi binding,
so a torch header there fails to compile. About 12 s a compilation, one per extension."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from sagebuild import matrix as build_matrix
from tests.cuda_toolchain import NVCC

ROOT = Path(__file__).resolve().parents[2]
CXX = shutil.which("c++") or shutil.which("g++")
MATRIX = build_matrix.load(ROOT / build_matrix.MATRIX_FILE)
PACKAGE, SAGE3 = MATRIX.package("sageattention"), MATRIX.package("sageattn3")


def _cuda_include() -> Path | None:
    if NVCC is None:
        return None
    include = Path(NVCC).resolve().parents[1] / "include"
    return include if (include / "cuda_runtime.h").is_file() else None


def _cases() -> list[tuple[str, Path, dict[str, str], list[str]]]:
    """(extension, bindings source, its macros, include folders) for every extension that compiles one."""
    includes = [str(ROOT / d) for d in PACKAGE.build.get("include_dirs", [])]
    cases = []
    for ext in PACKAGE.extensions:
        for shared in ext.shared:
            if shared.endswith("bindings.cpp"):
                cases.append((ext.name, ROOT / shared, dict(ext.define), includes))
    cases.append(
        (
            "sageattn3._C",
            ROOT / "sageattention3_blackwell" / "csrc" / "bindings.cpp",
            {},
            # its setup.py's folders: csrc/ and the copy of the shared header, which is this one
            [str(ROOT / "sageattention3_blackwell" / "csrc"), str(ROOT / "csrc" / "include")],
        )
    )
    return cases


CASES = _cases()


def test_the_c_abi_binding_includes_nothing_of_torch():
    """csrc/bindings.cpp, sageattn3's and every kernel file of both packages include no torch or ATen
    header: the modules serve every torch (build-matrix.yaml, binding: c-abi)."""
    assert PACKAGE.binding == "c-abi" and SAGE3.binding == "c-abi"
    sage3 = ROOT / "sageattention3_blackwell" / "csrc"
    paths = [ROOT / "csrc" / "bindings.cpp", *ROOT.glob("csrc/**/*.cu"), *ROOT.glob("csrc/**/*.h*")]
    for path in [*paths, *sage3.glob("*.cpp"), *sage3.glob("*.cu"), *sage3.glob("*.h*")]:
        text = path.read_text(encoding="utf-8")
        for header in ("torch/", "ATen/", "c10/", "pybind11"):
            assert f"#include <{header}" not in text, f"{path.relative_to(ROOT)} includes {header}"


def test_every_extension_family_is_covered():
    """One case per family macro of build-matrix.yaml, and sageattn3's bindings."""
    names = [name for name, *_ in CASES]
    assert {
        "sageattention._fused",
        "sageattention._qattn_sm80",
        "sageattention._qattn_sm89",
        "sageattention._qattn_sm90",
        "sageattn3._C",
    } <= set(names)


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler (c++, g++) on PATH")
@pytest.mark.parametrize(("name", "source", "define", "includes"), CASES, ids=[c[0] for c in CASES])
def test_bindings_compile_without_warnings(name, source, define, includes):
    cuda_include = _cuda_include()
    if cuda_include is None:
        pytest.skip("no CUDA toolkit headers (cuda_runtime.h next to nvcc)")
    args = [
        CXX,
        "-std=c++20",
        "-c",
        "-o",
        "/dev/null",
        "-Wall",
        "-Werror",
        *PACKAGE.build.get("cxx_flags", []),
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        f"-DTORCH_EXTENSION_NAME={name.rsplit('.', 1)[-1]}",
        *(f"-D{k}={v}" for k, v in define.items()),
        # the modules (the c-abi binding) see no torch header, and the limited Python API
        "-DPy_LIMITED_API=0x030A0000",
        *(f"-I{d}" for d in [*includes, str(cuda_include)]),
        f"-I{sysconfig.get_paths()['include']}",
        str(source),
    ]
    proc = subprocess.run(args, capture_output=True, text=True)
    assert proc.returncode == 0, (
        f"{name}: {source.relative_to(ROOT)} does not compile cleanly:\n{proc.stderr[-4000:]}"
    )
