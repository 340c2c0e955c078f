"""The host-side bindings (csrc/bindings.cpp, built once per extension of sageattention with that
extension's family macro; sageattention3_blackwell/csrc/bindings.cpp) compile with the host compiler
under ``-Wall -Werror``: a wheel's build log shows no warning of ours. The families are those of
build-matrix.yaml, the flags those setup.py passes (the package's cxx flags, torch's extension macros
and include folders). About 12 s a compilation, one per extension."""

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
PACKAGE = build_matrix.load(ROOT / build_matrix.MATRIX_FILE).package("sageattention")


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
            [str(ROOT / "sageattention3_blackwell" / "csrc")],
        )
    )
    return cases


CASES = _cases()


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
    torch_ext = pytest.importorskip("torch.utils.cpp_extension")
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
        *(f"-I{d}" for d in [*includes, *torch_ext.include_paths(), str(cuda_include)]),
        f"-I{sysconfig.get_paths()['include']}",
        str(source),
    ]
    proc = subprocess.run(args, capture_output=True, text=True)
    assert proc.returncode == 0, (
        f"{name}: {source.relative_to(ROOT)} does not compile cleanly:\n{proc.stderr[-4000:]}"
    )
