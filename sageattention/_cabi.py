"""The Python half of the compiled modules' package-neutral C ABI (csrc/include/sage_cabi.h), over ctypes.

One file serves both packages of the repository: ``sageattention._native`` imports it, and sageattn3's
build copies it into its own package as ``sageattn3._cabi`` (sageattention3_blackwell/shared_sources.py
says why a copy made by the build, not a second file kept by hand), so that neither package needs the
other at run time. Nothing here names a package: the callers pass theirs.

* ``load_module(package, module)``: the functions of ``<package>.<module>``, or why they cannot be had
  (not built here, another ABI version, not a module of this ABI);
* ``Library.call``: one op, its tensors packed as descriptors of ``DESC_WORDS`` int64 words, its int
  and float arguments in the op's order, on the current CUDA stream of the first tensor's device; a
  failed check comes back as a RuntimeError with the C side's message;
* ``read_build_info`` and ``cuda_line_problem``: what a wheel was built with (its ``_build_info.json``),
  and whether its CUDA line fits the installed torch.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
from array import array

import torch

__all__ = [
    "ABI_VERSION",
    "DESC_WORDS",
    "DTYPE_CODES",
    "Library",
    "cuda_line_problem",
    "descriptor",
    "load_module",
    "read_build_info",
]

#: sage_abi_version() of the modules this Python code can call (csrc/include/sage_cabi.h).
ABI_VERSION = 3
#: int64 words per tensor descriptor: data, dtype, device type (1: CUDA), device index, dims, 4 sizes,
#: 4 strides (csrc/include/sage_cabi.h, View).
DESC_WORDS = 13
#: Element types by their code in the descriptors (csrc/include/sage_cabi.h, DType).
DTYPE_CODES = {
    torch.float16: 0,
    torch.bfloat16: 1,
    torch.float32: 2,
    torch.int8: 3,
    torch.uint8: 4,
    torch.float8_e4m3fn: 5,
    torch.int32: 6,
}
BUILD_INFO = "_build_info.json"
_ABSENT = (0, -1, 0, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0)  # an optional tensor that is None
_PAD = (0, 0, 0, 0)
_RET_ZEROS = (0, 0, 0, 0)

# The op's arrays go as addresses of array.array buffers: packing them costs a fifth of ctypes arrays'
# (bench/host_native.py).
_OP_ARGTYPES = [ctypes.c_void_p] * 5

try:  # the raw stream handle, as torch's own generated code reads it (a microsecond less than
    # torch.cuda.current_stream().cuda_stream)
    _raw_stream = torch._C._cuda_getCurrentRawStream
except AttributeError:  # a torch without CUDA

    def _raw_stream(device: int) -> int:
        return torch.cuda.current_stream(device).cuda_stream


def read_build_info(package_dir: str) -> dict:
    """What a build compiled, with which CUDA, for which archs (``_build_info.json`` in the package's
    folder, written into the wheel by its setup.py); {} where the installation has no such record."""
    try:
        with open(os.path.join(package_dir, BUILD_INFO), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def cuda_line_problem(package: str, info: dict, torch_cuda: str | None = None) -> str | None:
    """Why ``package``'s compiled modules (built as ``info`` says) do not fit the installed torch, or None.

    A wheel is built for one CUDA line (12 or 13, ``cuda_line`` in its build record); a torch built for
    another line is refused: the modules' statically linked runtime of one line would then sit beside
    torch's of the other, and the driver may not run both. A torch without CUDA (a CPU or ROCm build)
    fits: there the compiled kernels are never chosen."""
    line = info.get("cuda_line")
    torch_cuda = torch.version.cuda if torch_cuda is None else torch_cuda
    if not line or not torch_cuda:
        return None
    torch_line = str(torch_cuda).split(".")[0]
    if torch_line == str(line):
        return None
    return (
        f"this {package} wheel is built for CUDA {line}.x (nvcc {info.get('nvcc', '?')}), "
        "but the installed "
        f"torch {torch.__version__} is built for CUDA {torch_cuda}. Install the wheel of torch's CUDA line: "
        f"`pip install --force-reinstall --no-deps {package} --index-url "
        f"<the {package} index>/cu{torch_line}` "
        "(docs/building.md, 'Which wheel'), or a torch built for CUDA "
        f"{line}.x; `python -m {package} env` shows both."
    )


def descriptor(t) -> tuple:
    """The DESC_WORDS int64 words of tensor ``t`` (None: an absent optional tensor)."""
    if t is None:
        return _ABSENT
    index = t.get_device()  # -1 on the CPU
    shape, strides = t.shape, t.stride()
    dims = len(shape)
    if dims == 4:
        return (t.data_ptr(), DTYPE_CODES.get(t.dtype, -1), index >= 0, index, 4, *shape, *strides)
    if dims > 4:
        raise ValueError(f"the compiled ops take tensors of at most 4 dims, got one of {dims}")
    return (
        t.data_ptr(),
        DTYPE_CODES.get(t.dtype, -1),
        index >= 0,
        index,
        dims,
        *(tuple(shape) + _PAD)[:4],
        *(strides + _PAD)[:4],
    )


class Library:
    """The functions of one compiled module (``<package>.<name>``)."""

    def __init__(self, name: str, path: str, package: str) -> None:
        self.name = name
        self.path = path
        self.package = package
        self._dll = ctypes.CDLL(path)
        self._dll.sage_abi_version.restype = ctypes.c_int
        self._dll.sage_last_error.restype = ctypes.c_char_p
        self._dll.sage_cuda_runtime_version.restype = ctypes.c_int
        self._ops: dict[str, object] = {}

    def abi_version(self) -> int:
        return int(self._dll.sage_abi_version())

    def cuda_runtime_version(self) -> int:
        """The CUDA toolkit the module was compiled with, as CUDART_VERSION (13000 for 13.0)."""
        return int(self._dll.sage_cuda_runtime_version())

    def has(self, symbol: str) -> bool:
        return hasattr(self._dll, symbol)

    def last_error(self) -> str:
        message = self._dll.sage_last_error()
        return message.decode("utf-8", "replace") if message else "unknown error"

    def function(self, symbol: str, restype, argtypes):
        """A plain exported function of the module (sizes, flags), typed."""
        fn = getattr(self._dll, symbol)
        fn.restype = restype
        fn.argtypes = argtypes
        return fn

    def op(self, name: str):
        fn = self._ops.get(name)
        if fn is None:
            fn = getattr(self._dll, f"sage_{name}")
            fn.restype = ctypes.c_int
            fn.argtypes = _OP_ARGTYPES
            self._ops[name] = fn
        return fn

    def call(self, name: str, tensors, ints=(), floats=(), device: int | None = None) -> tuple:
        """Run op ``name`` on the current stream of ``device`` (default: the first tensor's); returns
        its int64 return words. RuntimeError with the op's own message when a check fails."""
        words = array("q")
        for t in tensors:
            words.extend(descriptor(t))
        if device is None:
            device = tensors[0].get_device()
        stream = _raw_stream(device) if device >= 0 else 0
        ints, floats, ret = array("q", ints or (0,)), array("d", floats or (0.0,)), array("q", _RET_ZEROS)
        fn = self._ops.get(name) or self.op(name)
        status = fn(words.buffer_info()[0], ints.buffer_info()[0], floats.buffer_info()[0], stream,
                    ret.buffer_info()[0])  # fmt: skip
        if status != 0:
            raise RuntimeError(f"{self.package}::{name}: {self.last_error()}")
        return tuple(ret)


def load_module(package: str, module: str, problem: str | None = None) -> tuple[Library | None, str | None]:
    """(Library, None) for ``<package>.<module>``, or (None, why not). ``problem``: a reason known
    beforehand (a CUDA line that does not fit, ``cuda_line_problem``), returned as it is."""
    if problem is not None:
        return None, problem
    try:
        spec = importlib.util.find_spec(f"{package}.{module}")
    except (ImportError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return None, f"{package}.{module} is not built in this installation"
    try:
        library = Library(module, spec.origin, package)
    except OSError as exc:  # a file for another platform, a missing shared library
        return None, f"OSError: cannot load {spec.origin}: {exc}"
    except AttributeError:
        return None, f"{spec.origin} is not a {package} module of this ABI (no sage_abi_version)"
    if library.abi_version() != ABI_VERSION:
        return None, (
            f"{spec.origin} has ABI version {library.abi_version()}, "
            f"this Python code calls version {ABI_VERSION}: "
            "the compiled modules and the Python files come from different builds"
        )
    return library, None
