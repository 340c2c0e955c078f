"""sageattn3's torch ops over the C ABI of its module, on the CPU: the module built here from the real
csrc/bindings.cpp (the launchers of sage3_kernels.h stood in for, so that no nvcc is needed and nothing
ever launches) imports nothing of libtorch or of one CPython; the ops' fake implementations give the
shapes the C side checks the outputs against; a bad argument comes back as a RuntimeError that names
it; the ops are defined under torch.ops.sageattn3 and trace under torch.compile."""

from __future__ import annotations

import ctypes
import importlib.util
import json
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
import torch
from sage3_toolchain import CSRC, CXX, PACKAGE_ROOT, cuda_include
from sageattn3 import _cabi, ops

from sagebuild.verify import _TORCH_SYMBOL_RE, torch_imports

REPO = PACKAGE_ROOT.parent
#: The launchers stood in for: every one refuses (the C side's checks run before them), and the module
#: holds "sm_90a" code that no device runs.
STUB = r"""
#include "sage3_kernels.h"
namespace sage3 {
cudaError_t launch_quant_rows(const RowsQuantArgs&, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t launch_quant_vt(const VtQuantArgs&, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t launch_attention(const AttnArgs&, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t launch_mma_smoke(const uint8_t*, const uint8_t*, const uint8_t*, const uint8_t*, float*,
                             cudaStream_t) { return cudaErrorNotSupported; }
int compiled_families() { return 4; }
int device_family() { return 0; }
}  // namespace sage3
"""
#: What a module may import of CPython: the limited API's module creation, nothing else.
PYTHON_IMPORTS = {"PyModule_Create2"}


@pytest.fixture(scope="module")
def module(tmp_path_factory) -> Path:
    """sageattn3._C as setup.py links it (static CUDA runtime, limited API), with the stand-in launchers."""
    include = cuda_include()
    if CXX is None or include is None:
        pytest.skip("needs a C++ compiler and the CUDA headers")
    folder = tmp_path_factory.mktemp("sage3_module")
    (folder / "stub.cpp").write_text(STUB, encoding="utf-8")
    lib_dirs = [
        p for p in (include.parent / "lib64", include.parent / "lib") if (p / "libcudart_static.a").is_file()
    ]
    if not lib_dirs:
        pytest.skip(f"no static CUDA runtime next to {include}")
    out = folder / "_C.abi3.so"
    cmd = [CXX, "-std=c++17", "-O1", "-shared", "-fPIC", "-Wall", "-Werror", "-DTORCH_EXTENSION_NAME=_C",
           "-DPy_LIMITED_API=0x030A0000", f"-I{CSRC}", f"-I{REPO / 'csrc' / 'include'}", f"-I{include}",
           f"-I{sysconfig.get_paths()['include']}", str(CSRC / "bindings.cpp"), str(folder / "stub.cpp"),
           f"-L{lib_dirs[0]}", "-lcudart_static", "-lrt", "-lpthread", "-ldl", "-o", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def library(module):
    return _cabi.Library("_C", str(module), "sageattn3")


def test_the_module_imports_nothing_of_torch_or_one_python(module):
    needed, undefined = torch_imports(module.read_bytes())
    for name in needed:
        assert not name.startswith(("libtorch", "libc10", "libpython", "libcudart", "libshm")), needed
    assert not [s for s in undefined if _TORCH_SYMBOL_RE.search(s)]
    assert {s for s in undefined if s.startswith(("Py", "_Py"))} <= PYTHON_IMPORTS


@pytest.mark.skipif(importlib.util.find_spec("abi3audit") is None, reason="abi3audit is not installed")
def test_abi3audit_accepts_the_module(module):
    proc = subprocess.run([sys.executable, "-m", "abi3audit", "--assume-minimum-abi3", "3.10", "--strict",
                           str(module)], capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_source_of_the_module_includes_torch():
    for path in [*CSRC.glob("*.cpp"), *CSRC.glob("*.cu"), *CSRC.glob("*.h"), *CSRC.glob("*.cuh")]:
        text = path.read_text(encoding="utf-8")
        for header in ("torch/", "ATen/", "c10/", "pybind11"):
            assert f"#include <{header}" not in text, f"{path.name} includes {header}"


def test_the_module_exports_the_abi(library):
    assert library.abi_version() == _cabi.ABI_VERSION
    for symbol in ("sage_quant_nvfp4_rows", "sage_quant_nvfp4_vt", "sage_attn_nvfp4", "sage_mma_nvfp4_smoke",
                   "sage_compiled_families", "sage_device_family", "sage_last_error"):  # fmt: skip
        assert library.has(symbol), symbol
    assert library.function("sage_compiled_families", ctypes.c_int, [])() == 4
    # no GPU to ask (or, on a GPU machine, no code for it): no family
    assert library.function("sage_device_family", ctypes.c_int, [ctypes.c_int64])(0) in (-1, 0)


# --------------------------------------------------------------------------------------------------
# Fake implementations: the shapes of the outputs


def fakes(b=1, hq=4, hkv=2, nq=200, nk=300, d=128, mode=2):
    """The quantization and attention fakes on meta tensors (what torch.compile traces)."""
    meta = {"device": "meta", "dtype": torch.bfloat16}
    q, k, v = (
        torch.empty(b, hq, nq, d, **meta),
        torch.empty(b, hkv, nk, d, **meta),
        torch.empty(b, hkv, nk, d, **meta),
    )
    qq = ops.quant_nvfp4_rows(None, q, 128, mode, None)
    kq = ops.quant_nvfp4_rows(None, k, 128, 1, torch.empty(b, hkv, d, device="meta"))
    vq = ops.quant_nvfp4_vt(None, v, 128)
    return q, qq, kq, vq


@pytest.mark.parametrize(("nq", "nk", "d"), [(1, 1, 64), (200, 300, 128), (256, 128, 64), (1000, 17, 128)])
def test_the_fakes_give_the_kernels_shapes(nq, nk, d):
    _, (qc, qs, qg, qm), (kc, ks, kg, km), (vc, vs, vg) = fakes(nq=nq, nk=nk, d=d)
    nq_pad, nk_pad = -(-nq // 128) * 128, -(-nk // 128) * 128
    assert [tuple(t.shape) for t in (qc, qs, qg, qm)] == [
        (1, 4, nq_pad, d // 2), (1, 4, nq_pad, d // 16), (1, 4, nq_pad // 128), (1, 4, nq_pad // 128, d)
    ]  # fmt: skip
    assert [t.dtype for t in (qc, qs, qg, qm)] == [torch.uint8, torch.uint8, torch.float32, torch.float32]
    assert tuple(km.shape) == (0,)  # the mean is returned in mode 2 only
    assert [tuple(t.shape) for t in (kc, ks, kg)] == [
        (1, 2, nk_pad, d // 2),
        (1, 2, nk_pad, d // 16),
        (1, 2, nk_pad // 128),
    ]
    assert [tuple(t.shape) for t in (vc, vs, vg)] == [
        (1, 2, d, nk_pad // 2),
        (1, 2, d, nk_pad // 16),
        (1, 2, nk_pad // 128),
    ]
    out = torch.empty(1, 4, nq, d, device="meta", dtype=torch.bfloat16)
    lse = ops.attn_nvfp4(None, qc, qs, qg, kc, ks, kg, vc, vs, vg, None, None, out, nq, nk, False, 0.1, True)
    assert tuple(lse.shape) == (1, 4, nq) and lse.dtype == torch.float32
    assert tuple(ops.attn_nvfp4(None, qc, qs, qg, kc, ks, kg, vc, vs, vg, None, None, out, nq, nk, False, 0.1,
                                False).shape) == (0,)  # fmt: skip
    smoke = ops.mma_nvfp4_smoke(None, *(torch.empty(r, c, dtype=torch.uint8, device="meta")
                                        for r, c in ((16, 32), (16, 4), (8, 32), (8, 4))))  # fmt: skip
    assert tuple(smoke.shape) == (16, 8) and smoke.dtype == torch.float32


def test_a_tensor_of_other_dims_is_refused_before_any_shape_is_read():
    with pytest.raises(RuntimeError, match=r"sageattn3::quant_nvfp4_vt: v must be a 4-d tensor"):
        ops.quant_nvfp4_vt(None, torch.empty(2, 3, 64), 128)


# --------------------------------------------------------------------------------------------------
# The C side's checks, reached with tensors it takes for CUDA ones


@pytest.fixture
def as_cuda(monkeypatch):
    """Descriptors of CPU tensors that say cuda:0: the C side checks them as CUDA tensors, then stops at
    the device (no GPU here; on a GPU machine, the stand-in module holds no code for it)."""
    real = _cabi.descriptor

    def descriptor(t):
        words = real(t)
        return words if t is None else (words[0], words[1], 1, 0, *words[4:])

    monkeypatch.setattr(_cabi, "descriptor", descriptor)


def cpu_inputs(nq=200, nk=300, d=128, dtype=torch.bfloat16):
    q = torch.randn(1, 4, nq, d).to(dtype)
    k, v = torch.randn(1, 2, nk, d).to(dtype), torch.randn(1, 2, nk, d).to(dtype)
    return q, k, v


def quantized(q, k, v):
    """The outputs the ops allocate (their fakes on CPU tensors)."""
    qq = ops.quant_nvfp4_rows(None, q, 128, 2, None)
    kq = ops.quant_nvfp4_rows(None, k, 128, 1, k.float().mean(2))
    vq = ops.quant_nvfp4_vt(None, v, 128)
    return qq, kq, vq


def stopped_at_the_device(err: pytest.ExceptionInfo) -> bool:
    text = str(err.value)
    return "cudaGetDevice failed" in text or "holds code for sm_90a, not for the GPU cuda:0" in text


def test_the_outputs_the_ops_allocate_pass_the_c_checks(library, as_cuda):
    """Every op with well-formed arguments gets past every argument check: what stops it is the device."""
    q, k, v = cpu_inputs()
    for mode, mean in ((0, None), (1, q.float().mean(2)), (2, None)):
        with pytest.raises(RuntimeError) as err:
            ops.quant_nvfp4_rows(library, q, 128, mode, mean)
        assert stopped_at_the_device(err), err.value
    with pytest.raises(RuntimeError) as err:
        ops.quant_nvfp4_vt(library, v, 128)
    assert stopped_at_the_device(err), err.value
    (qc, qs, qg, qm), (kc, ks, kg, km), (vc, vs, vg) = quantized(q, k, v)
    corr = torch.zeros(1, 4, qg.shape[2], 300)
    for mask in (
        None,
        torch.ones(200, 300, dtype=torch.bool).expand(1, 4, 200, 300),
        torch.zeros(1, 4, 200, 300),
    ):
        for return_lse in (False, True):
            out = torch.empty(1, 200, 4, 128, dtype=torch.float16).transpose(1, 2)  # NHD memory
            with pytest.raises(RuntimeError) as err:
                ops.attn_nvfp4(library, qc, qs, qg, kc, ks, kg, vc, vs, vg, corr, mask, out, 200, 300, True,
                               0.1, return_lse)  # fmt: skip
            assert stopped_at_the_device(err), err.value
    with pytest.raises(RuntimeError) as err:
        ops.mma_nvfp4_smoke(
            library, *(torch.zeros(r, c, dtype=torch.uint8) for r, c in ((16, 32), (16, 4), (8, 32), (8, 4)))
        )
    assert "cudaGetDevice failed" in str(err.value) or "this op needs sm_120a" in str(err.value), err.value


def test_a_cpu_tensor_is_named(library):
    """Without the stand-in descriptors: a CPU tensor is refused by name, and no GPU is touched."""
    q, _, v = cpu_inputs()
    with pytest.raises(
        RuntimeError, match=r"^sageattn3::quant_nvfp4_rows: x must be a CUDA tensor, got one on cpu$"
    ):
        ops.quant_nvfp4_rows(library, q, 128, 2, None)
    with pytest.raises(
        RuntimeError, match=r"^sageattn3::quant_nvfp4_vt: v must be a CUDA tensor, got one on cpu$"
    ):
        ops.quant_nvfp4_vt(library, v, 128)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("block", r"block must be 128 \(the kernels' block\), got 64"),
        ("mode", r"mode must be 0 \(no smoothing\), 1 \(subtract mean\) or 2 \(per-block mean\), got 3"),
        ("no mean", r"mean \(mode 1\) must be a contiguous float32 tensor \[B, H, D\] = \[1, 4, 128\] on "
                    r"cuda:0, got None"),
        ("head dim", r"x: the head dim D \(its last dim\) must be 64 or 128, got 96"),
        ("dtype", r"x must be float16 or bfloat16, got float32"),
        ("strided", r"x must have a contiguous last dimension"),
        ("codes", r"output codes must be a contiguous uint8 tensor \[B, H, N_pad, D / 2\] = "
                  r"\[1, 4, 256, 64\] on cuda:0, got uint8 \[1, 4, 200, 64\]"),
    ],
)  # fmt: skip
def test_a_bad_quantization_argument_is_named(library, as_cuda, case, message):
    q, _, _ = cpu_inputs()
    args = {"x": q, "block": 128, "mode": 2, "mean": None}
    if case == "block":
        args["block"] = 64
    elif case == "mode":
        args["mode"] = 3
    elif case == "no mean":
        args["mode"] = 1
    elif case == "head dim":
        args["x"] = torch.randn(1, 4, 200, 96, dtype=torch.bfloat16)
    elif case == "dtype":
        args["x"] = q.float()
    elif case == "strided":
        args["x"] = torch.randn(1, 4, 200, 256, dtype=torch.bfloat16)[..., ::2]
    if case == "codes":  # an output of the wrong shape, as a caller other than ops.py could pass it
        x = args["x"]
        outputs = ops.quant_nvfp4_rows(None, x, 128, 2, None)
        bad = torch.empty(1, 4, 200, 64, dtype=torch.uint8)
        with pytest.raises(RuntimeError, match=f"^sageattn3::quant_nvfp4_rows: {message}"):
            library.call("quant_nvfp4_rows", (x, None, bad, *outputs[1:]), (128, 2))
        return
    with pytest.raises(RuntimeError, match=f"^sageattn3::quant_nvfp4_rows: {message}"):
        ops.quant_nvfp4_rows(library, args["x"], args["block"], args["mode"], args["mean"])


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("q_scales", r"q_scales must be a contiguous uint8 tensor \[B, Hq, Nq_pad, D / 16\] = "
                     r"\[1, 4, 256, 8\]"),
        ("v_gs", r"v_gs must be a contiguous float32 tensor \[B, Hkv, Nk_pad / 128\] = \[1, 2, 3\]"),
        ("nk", r"nk must be in \[1, Nk_pad\] and k_codes' Nk_pad a multiple of 128, got nk = 400, "
               r"Nk_pad = 384"),
        ("heads", r"the query heads of q_codes \(4\) must be a multiple of the KV heads of k_codes \(3\)"),
        ("out", r"out must be a float16 or bfloat16 tensor \[B, Hq, Nq, D\] = \[1, 4, 200, 128\] with a "
                r"dense last dimension on cuda:0, got float32"),
        ("odd out", r"out: the kernel stores pairs of channels, so its strides must be even"),
        ("mask", r"mask must be uint8 or bool \(keep where nonzero\) or float32 \(added to the scores\), "
                 r"got int32"),
        ("mask shape", r"mask must be \[B, Hq, Nq, Nk\] = \[1, 4, 200, 300\] \(expanded\) on cuda:0, "
                       r"got \[200, 300\]"),
        ("corr", r"corr must be a contiguous float32 tensor \[B, Hq, Nq_pad / 128, Nk\] = \[1, 4, 2, 300\]"),
    ],
)  # fmt: skip
def test_a_bad_attention_argument_is_named(library, as_cuda, case, message):
    q, k, v = cpu_inputs()
    (qc, qs, qg, _), (kc, ks, kg, _), (vc, vs, vg) = quantized(q, k, v)
    args = dict(q_codes=qc, q_scales=qs, q_gs=qg, k_codes=kc, k_scales=ks, k_gs=kg, v_codes=vc, v_scales=vs,
                v_gs=vg, corr=None, mask=None, out=torch.empty(1, 4, 200, 128, dtype=torch.bfloat16), nq=200,
                nk=300, is_causal=False, qk_scale=0.1, return_lse=True)  # fmt: skip
    if case == "q_scales":
        args["q_scales"] = qs[:, :, :200]
    elif case == "v_gs":
        args["v_gs"] = torch.empty(1, 2, 4)
    elif case == "nk":
        args["nk"] = 400
    elif case == "heads":
        _, (kc, ks, kg, _), _ = quantized(q, torch.randn(1, 3, 300, 128, dtype=torch.bfloat16), v)
        args.update(k_codes=kc, k_scales=ks, k_gs=kg)
    elif case == "out":
        args["out"] = args["out"].float()
    elif case == "odd out":
        args["out"] = torch.empty(1, 4, 200, 129, dtype=torch.bfloat16)[..., :128]
    elif case == "mask":
        args["mask"] = torch.zeros(1, 4, 200, 300, dtype=torch.int32)
    elif case == "mask shape":
        args["mask"] = torch.zeros(200, 300)
    elif case == "corr":
        args["corr"] = torch.zeros(1, 4, 1, 300)
    with pytest.raises(RuntimeError, match=f"^sageattn3::attn_nvfp4: {message}"):
        ops.attn_nvfp4(library, *args.values())


# --------------------------------------------------------------------------------------------------
# The ops under torch.ops.sageattn3 (in a fresh interpreter: an op is defined once per process)

REGISTER = """
import json, sys, torch
from sageattn3 import _cabi, ops
library = _cabi.Library("_C", sys.argv[1], "sageattn3")
_cabi.load_module = lambda package, module, problem=None: (library, None)
assert ops.load() and ops.compiled_families() == ["sm_90a"]
assert ops.device_family(torch.device("cuda", 0)) is None
kernels = torch.ops.sageattn3
def attention(q, k, v):
    qc, qs, qg, qm = kernels.quant_nvfp4_rows(q, 128, 2, None)
    kc, ks, kg, _ = kernels.quant_nvfp4_rows(k, 128, 1, k.float().mean(2))
    vc, vs, vg = kernels.quant_nvfp4_vt(v, 128)
    out = torch.empty_like(q)
    lse = kernels.attn_nvfp4(qc, qs, qg, kc, ks, kg, vc, vs, vg, None, None, out, q.shape[2], k.shape[2],
                             True, 0.1, True)
    return out, lse, qm
meta = dict(device="meta", dtype=torch.bfloat16)
q = torch.empty(1, 4, 200, 64, **meta)
k, v = torch.empty(1, 2, 300, 64, **meta), torch.empty(1, 2, 300, 64, **meta)
compiled = torch.compile(attention, fullgraph=True, backend="eager")
print(json.dumps([list(t.shape) for t in compiled(q, k, v)]))
"""


def test_the_ops_are_defined_and_trace_under_torch_compile(module):
    code = textwrap.dedent(REGISTER)
    proc = subprocess.run([sys.executable, "-c", code, str(module)], capture_output=True, text=True,
                          cwd=str(PACKAGE_ROOT), timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [[1, 4, 200, 64], [1, 4, 200], [1, 4, 2, 64]]


def test_without_the_module_the_reason_is_kept(monkeypatch):
    """A source tree or pure build: no module, the ops stay undefined and unavailable_reason says why."""
    monkeypatch.setattr(ops, "load_error", None)
    monkeypatch.setattr(ops, "_library", [])
    monkeypatch.setattr(_cabi, "load_module", lambda package, module, problem=None: (None, "not built here"))
    assert ops.load() is False and ops.compiled_families() == []
    assert (
        ops.unavailable_reason(torch.device("cuda", 0))
        == "the extension is not built in this install (not built here)"
    )
