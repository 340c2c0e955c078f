"""The package-neutral C ABI: csrc/include/sage_cabi.h (the C side both packages' modules include) and
sageattention/_cabi.py (its Python mirror, which sageattn3's build copies) agree. A probe module built
here on the header reads what _cabi packs: the descriptor words, the element type codes and their
names, the int and float arguments, the version exports, and the error text that comes back as a
RuntimeError. The copy sageattn3 gets stays the one file (shared_sources.py, build-matrix.yaml)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from sageattention import _cabi, _native
from sagebuild.matrix import load
from tests.cuda_toolchain import NVCC

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "csrc" / "include" / "sage_cabi.h"
SAGE3 = ROOT / "sageattention3_blackwell"
CXX = shutil.which("g++") or shutil.which("c++")
CUDA_INCLUDE = Path(NVCC).resolve().parents[1] / "include" if NVCC else None

PROBE = r"""
#include "sage_cabi.h"
SAGE_PYTHON_MODULE(TORCH_EXTENSION_NAME)

// ints: [which tensor]; ret: [dims, dtype code, device (-1: the CPU), numel (-1: absent)]
SAGE_OP(describe) {
  return guarded([&] {
    SAGE_OP_BODY;
    const View x = a.tensor(static_cast<int>(a.integer(0)));
    ret[0] = x.dim();
    ret[1] = x.dtype;
    ret[2] = x.cuda ? x.device : -1;
    ret[3] = x.defined() ? x.numel() : -1;
  });
}

// Fails with what it read of tensor 0 and its scalars.
SAGE_OP(echo) {
  return guarded([&] {
    SAGE_OP_BODY;
    const View x = a.tensor(0);
    fail("x is ", DtypeOf{x}, " ", SizesOf{x}, " strides ", StridesOf{x}, " on ", DeviceOf{x},
         ", contiguous ", x.contiguous(), ", ints ", a.integer(0), " ", a.integer(1), ", float ", a.real(1));
  });
}
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """The probe module as ``probepkg._probe``, loaded through _cabi.load_module."""
    if CXX is None or CUDA_INCLUDE is None or not (CUDA_INCLUDE / "cuda_runtime.h").is_file():
        pytest.skip("needs a C++ compiler and the CUDA headers")
    folder = tmp_path_factory.mktemp("probe")
    package = folder / "probepkg"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    source = folder / "probe.cpp"
    source.write_text(PROBE, encoding="utf-8")
    cudart = CUDA_INCLUDE.parent / "lib64"
    cmd = [CXX, "-std=c++17", "-O1", "-shared", "-fPIC", "-Wall", "-Werror", "-DTORCH_EXTENSION_NAME=_probe",
           "-DPy_LIMITED_API=0x030A0000", f"-I{HEADER.parent}", f"-I{CUDA_INCLUDE}",
           f"-I{sysconfig.get_paths()['include']}", str(source), f"-L{cudart}", "-lcudart_static", "-lrt",
           "-lpthread", "-ldl", "-o", str(package / "_probe.abi3.so")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sys.path.insert(0, str(folder))
    try:
        library, why = _cabi.load_module("probepkg", "_probe")
    finally:
        sys.path.remove(str(folder))
    assert library is not None, why
    return library


def test_the_versions_are_the_header_s(probe):
    assert probe.abi_version() == _cabi.ABI_VERSION == _native.ABI_VERSION
    version = re.search(r"#define CUDART_VERSION\s+(\d+)", (CUDA_INCLUDE / "cuda_runtime_api.h").read_text())
    assert probe.cuda_runtime_version() == int(version.group(1))


def test_descriptors_read_back_as_packed(probe):
    x = torch.empty(2, 3, 4, 8, dtype=torch.bfloat16).transpose(1, 2)
    assert probe.call("describe", (x,), (0,), device=-1) == (4, _cabi.DTYPE_CODES[torch.bfloat16], -1, 192)
    v = torch.empty(5, dtype=torch.int32)
    assert probe.call("describe", (x, None, v), (2,), device=-1) == (1, _cabi.DTYPE_CODES[torch.int32], -1, 5)
    assert probe.call("describe", (x, None), (1,), device=-1)[:1] == (-1,)  # an absent optional tensor


@pytest.mark.parametrize("dtype", list(_cabi.DTYPE_CODES), ids=str)
def test_every_dtype_code_names_its_dtype(probe, dtype):
    """DTYPE_CODES and the header's DType and dtype_name: the code of each dtype reads back as its name."""
    x = torch.empty(3, 4, dtype=dtype)[:, :2]
    with pytest.raises(RuntimeError) as err:
        probe.call("echo", (x,), (7, -9), (0.25, 1.5), device=-1)
    name = str(dtype).removeprefix("torch.")
    assert str(err.value) == (
        f"probepkg::echo: x is {name} [3, 2] strides [4, 1] on cpu, contiguous 0, ints 7 -9, float 1.5"
    )


def test_the_op_signature_and_descriptor_width_are_the_header_s():
    text = HEADER.read_text(encoding="utf-8")
    assert int(re.search(r"constexpr int kDescWords = (\d+);", text).group(1)) == _cabi.DESC_WORDS
    signature = re.search(r"#define SAGE_OP\(name\)[^\n]*\n([^\n]*)", text).group(1)
    assert signature.count(",") + 1 == len(_cabi._OP_ARGTYPES) == 5
    codes = dict(re.findall(r"\b(k\w+) = (\d+)", re.search(r"enum DType[^}]*}", text).group(0)))
    assert sorted(int(c) for c in codes.values()) == sorted(_cabi.DTYPE_CODES.values())
    assert re.search(r"sage_abi_version\(\) \{ return (\d+); \}", text).group(1) == str(_cabi.ABI_VERSION)


def test_sageattn3_takes_the_one_copy_of_each_shared_file():
    """sageattn3's build copies sage_cabi.h, _cabi.py and sage_setup.py from here (shared_sources.SHARED),
    sagebuild stages the same files (build-matrix.yaml, shared_files), and its setup.py's floors are the
    matrix's."""
    sys.path.insert(0, str(SAGE3))
    try:
        import shared_sources
    finally:
        sys.path.remove(str(SAGE3))
    package = load().package("sageattn3")
    assert (
        set(shared_sources.SHARED)
        == set(package.shared_files)
        == {
            "csrc/include/sage_cabi.h",
            "sageattention/_cabi.py",
            "sagebuild/sage_setup.py",
        }
    )
    for source in shared_sources.SHARED:
        assert (ROOT / source).is_file()
    ignored = subprocess.run(["git", "check-ignore", *shared_sources.SHARED.values()],
                             cwd=SAGE3, capture_output=True, text=True)  # fmt: skip
    if ignored.returncode != 128:  # (not a git checkout)
        assert ignored.stdout.split() == list(shared_sources.SHARED.values()), (
            "the copies must be git-ignored"
        )
    tree = ast.parse((SAGE3 / "setup.py").read_text(encoding="utf-8"))
    floors = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id in ("TORCH_FLOOR", "PYTHON_FLOOR")
    }  # fmt: skip
    assert floors == {
        "TORCH_FLOOR": package.abi3["torch_floor"],
        "PYTHON_FLOOR": package.abi3["python_floor"],
    }
