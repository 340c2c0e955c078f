"""``sagebuild verify`` on sageattn3's wheels, whose module is now of the c-abi binding: its abi3 wheel
(`sageattn3-1.0.0-cp310-abi3-...`, ``torch>=2.9.0``) passes with a torch-free, limited-API module; the
same wheel whose module imports a libtorch symbol or links libtorch is rejected, and so is a per-torch
(local-version) wheel whose module does, since every sageattn3 module claims to be torch-free."""

from __future__ import annotations

import pytest

from sagebuild.matrix import load
from sagebuild.verify import verify_wheel
from tests.unit.test_sagebuild_verify import failures, fake_cuobjdump, make_wheel, options  # noqa: F401
from tests.unit.test_verify_abi3 import CXX, GOOD, TORCH_SYMBOL, built, compile_module  # noqa: F401

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")
ABI3 = "sageattn3-1.0.0-cp310-abi3-linux_x86_64.whl"
PER_TORCH = "sageattn3-1.0.0+cu130torch2.14.1-cp312-cp312-linux_x86_64.whl"


@pytest.fixture(scope="module")
def matrix():
    return load()


@pytest.fixture(scope="module")
def modules(tmp_path_factory, built) -> dict[str, bytes]:  # noqa: F811
    """sageattn3._C stand-ins with sm_100a SASS, and test_verify_abi3's module that links libtorch."""
    folder = tmp_path_factory.mktemp("sage3_modules")
    good, torch_symbol = (source.replace("SASS: sm_80", "SASS: sm_100a") for source in (GOOD, TORCH_SYMBOL))
    return {
        "good": compile_module(folder, "_C", good),
        "torch_symbol": compile_module(folder, "_C", torch_symbol),
        "links_torch": built["links_torch"],
    }


def sage3_wheel(folder, module: bytes, filename: str = ABI3):
    abi3 = filename == ABI3
    return make_wheel(
        folder,
        filename,
        version="1.0.0" if abi3 else "1.0.0+cu130torch2.14.1",
        requires=("torch>=2.9.0",) if abi3 else ("torch==2.14.1",),
        build=None,
        tag="cp310-abi3-linux_x86_64" if abi3 else "cp312-cp312-linux_x86_64",
        files={"sageattn3/__init__.py": b"", "sageattn3/_cabi.py": b"", "sageattn3/_C.abi3.so": module},
        build_info={
            "torch": "2.14.1",
            "torch_cuda": "13.0",
            "nvcc": "13.0.88",
            "archs": ["10.0a"],
            "wheel_kind": "abi3" if abi3 else "pinned",
            "cuda_line": "13",
            "binding": "c-abi",
            "extensions": {"sageattn3._C": ["10.0a"]},
        },
    )


def test_the_abi3_wheel_passes(tmp_path, matrix, modules, fake_cuobjdump):  # noqa: F811
    report = verify_wheel(sage3_wheel(tmp_path, modules["good"]), matrix, options(fake_cuobjdump))
    assert report.passed, report.render()
    text = report.render()
    assert "abi3 wheel: CUDA 13.x line (the default line, no local version), every torch >= 2.9.0" in text
    assert "METADATA: Requires-Dist torch>=2.9.0 (the abi3 floor, never an exact pin)" in text
    assert "torch-free sageattn3/_C.abi3.so: links no libtorch" in text
    assert "abi3 claim: abi3audit finds only limited-API symbols of CPython 3.10" in text


@pytest.mark.parametrize(
    ("module", "reason"),
    [
        ("torch_symbol", "libtorch C++ symbols, e.g. _ZN3c10"),
        ("links_torch", "imports libtorch: NEEDED libtorch_cpu.so"),
    ],
)
@pytest.mark.parametrize("filename", [ABI3, PER_TORCH])
def test_a_module_that_imports_libtorch_is_rejected(tmp_path, matrix, modules, fake_cuobjdump, module, reason,  # noqa: F811
                                                     filename):  # fmt: skip
    report = verify_wheel(sage3_wheel(tmp_path, modules[module], filename), matrix, options(fake_cuobjdump))
    assert not report.passed
    assert any(reason in label for label in failures(report)), report.render()


def test_an_abi3_wheel_pinned_to_one_torch_is_rejected(tmp_path, matrix, modules, fake_cuobjdump):  # noqa: F811
    files = {"sageattn3/_C.abi3.so": modules["good"]}
    pinned = make_wheel(tmp_path, ABI3, version="1.0.0", requires=("torch==2.14.1",), build=None,
                        tag="cp310-abi3-linux_x86_64", files=files)  # fmt: skip
    report = verify_wheel(pinned, matrix, options(fake_cuobjdump, allow_missing_cuobjdump=True))
    assert any("an abi3 wheel requires torch>=2.9.0 and nothing else of torch" in f for f in failures(report))
