"""``sagebuild verify`` on abi3 wheels whose modules are real shared objects, compiled here: a
torch-free, limited-API module passes; one that links libtorch, one that imports a libtorch C++ symbol
and one that uses a Python symbol outside the limited API are each rejected, naming the reason."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from sagebuild.matrix import load
from sagebuild.verify import torch_imports, verify_wheel
from tests.unit.test_sagebuild_verify import failures, fake_cuobjdump, make_wheel, options  # noqa: F401

CXX = shutil.which("g++") or shutil.which("c++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")
WHEEL = "sageattention-2.2.0-cp310-abi3-linux_x86_64.whl"

#: A module as csrc/bindings.cpp makes one: an empty limited-API Python module and plain C functions.
#: The SASS line is what the stand-in cuobjdump reads.
GOOD = r"""
#define Py_LIMITED_API 0x030A0000
#include <Python.h>
extern "C" __attribute__((used)) const char sage_fake_sass[] = "SASS: sm_80\n";
extern "C" int sage_abi_version() { return 1; }
static PyModuleDef def = {PyModuleDef_HEAD_INIT, "NAME", nullptr, -1,
                          nullptr, nullptr, nullptr, nullptr, nullptr};
PyMODINIT_FUNC PyInit_NAME(void) { return PyModule_Create(&def); }
"""
#: What a libtorch binding brings: a call into c10 (left undefined, as libtorch would provide it).
TORCH_SYMBOL = (
    GOOD
    + "namespace c10 { void check_fail(const char*); }\n"
    + ('extern "C" void sage_fail() { c10::check_fail("x"); }\n')
)
#: A Python symbol outside the limited API.
FULL_API = GOOD + (
    'extern "C" void _PyObject_Dump(PyObject*);\n'
    'extern "C" void sage_dump(PyObject* o) { _PyObject_Dump(o); }\n'
)


@pytest.fixture(scope="module")
def matrix():
    return load()


def compile_module(folder: Path, name: str, source: str, libs: tuple[str, ...] = ()) -> bytes:
    src = folder / f"{name}.cpp"
    src.write_text(source.replace("NAME", name), encoding="utf-8")
    out = folder / f"{name}.so"
    include = sysconfig.get_paths()["include"]
    cmd = [CXX, "-shared", "-fPIC", "-O1", f"-I{include}", str(src), "-o", str(out), f"-L{folder}", *libs]
    subprocess.run(cmd, check=True, capture_output=True)
    return out.read_bytes()


def abi3_wheel(folder: Path, fused: bytes, sm80: bytes) -> Path:
    return make_wheel(
        folder,
        WHEEL,
        requires=("torch>=2.6.0",),
        build=None,
        tag="cp310-abi3-linux_x86_64",
        files={
            "sageattention/__init__.py": b"",
            "sageattention/_fused.abi3.so": fused,
            "sageattention/_qattn_sm80.abi3.so": sm80,
        },
        build_info={
            "torch": "2.14.1",
            "torch_cuda": "13.0",
            "nvcc": "13.0.88",
            "archs": ["8.0"],
            "wheel_kind": "abi3",
            "cuda_line": "13",
            "extensions": {"sageattention._fused": ["8.0"], "sageattention._qattn_sm80": ["8.0"]},
        },
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, bytes]:
    folder = tmp_path_factory.mktemp("modules")
    # a stand-in libtorch_cpu.so to link against
    (folder / "stub.cpp").write_text('extern "C" int torch_stub() { return 0; }\n', encoding="utf-8")
    subprocess.run([CXX, "-shared", "-fPIC", str(folder / "stub.cpp"), "-o", str(folder / "libtorch_cpu.so")],
                   check=True, capture_output=True)  # fmt: skip
    return {
        "fused": compile_module(folder, "_fused", GOOD),
        "sm80": compile_module(folder, "_qattn_sm80", GOOD),
        # --no-as-needed: keep the NEEDED entry although nothing of the library is called
        "links_torch": compile_module(folder, "_qattn_sm80", GOOD, ("-Wl,--no-as-needed", "-ltorch_cpu")),
        "torch_symbol": compile_module(folder, "_qattn_sm80", TORCH_SYMBOL),
        "full_api": compile_module(folder, "_qattn_sm80", FULL_API),
    }


def test_a_torch_free_limited_api_wheel_passes(tmp_path, matrix, built, fake_cuobjdump):  # noqa: F811
    report = verify_wheel(
        abi3_wheel(tmp_path, built["fused"], built["sm80"]), matrix, options(fake_cuobjdump)
    )
    assert report.passed, report.render()
    text = report.render()
    assert "torch-free sageattention/_qattn_sm80.abi3.so: links no libtorch" in text
    assert "abi3 claim: abi3audit finds only limited-API symbols of CPython 3.10" in text


@pytest.mark.parametrize(
    "module,reason",
    [
        ("links_torch", "imports libtorch: NEEDED libtorch_cpu.so"),
        ("torch_symbol", "libtorch C++ symbols, e.g. _ZN3c10"),
        ("full_api", "abi3 claim: abi3audit:"),
    ],
)
def test_a_wheel_that_breaks_its_claims_is_rejected(tmp_path, matrix, built, fake_cuobjdump, module, reason):  # noqa: F811
    report = verify_wheel(
        abi3_wheel(tmp_path, built["fused"], built[module]), matrix, options(fake_cuobjdump)
    )
    assert not report.passed
    assert any(reason in label for label in failures(report)), report.render()


def test_torch_imports_reads_needed_and_undefined(built):
    needed, undefined = torch_imports(built["links_torch"])
    assert "libtorch_cpu.so" in needed and "PyModule_Create2" in undefined
    assert any(s.startswith("_ZN3c10") for s in torch_imports(built["torch_symbol"])[1])
    assert torch_imports(b"MZ not an ELF") == ([], [])
