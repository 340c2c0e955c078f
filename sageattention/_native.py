"""The compiled modules' C ABI (csrc/bindings.cpp), loaded with ctypes.

The compiled modules (``sageattention._fused``, ``_qattn_sm80``, ``_qattn_sm89``, ``_qattn_sm90``)
include no torch header and link no libtorch: their CUDA runtime is linked statically and their ops
are plain C functions over tensor descriptors, so one wheel serves every PyTorch from the floor in
its METADATA on (docs/building.md, "One wheel for every PyTorch"). This module (over ``_cabi``, the
package-neutral half) is the only one that touches them:

* ``load(module)``: the module's functions, or why they cannot be had (not built here, another ABI
  version, a CUDA line that does not fit the installed torch);
* ``Library.call``: one op, its tensors packed as descriptors of ``DESC_WORDS`` int64 words, its int
  and float arguments in the op's order, on the current CUDA stream of the first tensor's device;
  a failed check comes back as a RuntimeError with the C side's message;
* ``build_info()`` and ``cuda_line_problem()``: what the wheel was built with, and whether its CUDA
  line fits the installed torch (checked when sageattention is imported).

sageattention/cuda_ops.py defines the torch ops on top of it. The package-neutral part (descriptors,
``Library``, loading) is ``sageattention._cabi``, which sageattn3 shares; this module adds what is
sageattention's own: its build record, its modules and ``Plan``.
"""

from __future__ import annotations

import os
from array import array

from . import _cabi
from ._cabi import _RET_ZEROS, ABI_VERSION, DESC_WORDS, Library, _raw_stream
from ._cabi import DTYPE_CODES as DTYPE_CODES  # the element type codes, for callers of this module
from ._cabi import descriptor as _descriptor

__all__ = ["ABI_VERSION", "DESC_WORDS", "Library", "build_info", "cuda_line_problem", "load"]

PACKAGE = "sageattention"
_build_record: list = []  # [dict], read once
_loaded: dict[str, tuple[Library | None, str | None]] = {}


def build_info() -> dict:
    """What the build compiled, with which CUDA, for which archs (``_build_info.json``, written into
    the wheel by setup.py): ``{"extensions": {"sageattention._qattn_sm89": ["8.9", ...], ...},
    "nvcc": "13.0.88", "cuda_line": "13", ...}``; {} where the installation has no such record."""
    if not _build_record:
        _build_record.append(_cabi.read_build_info(os.path.dirname(os.path.abspath(__file__))))
    return _build_record[0]


def cuda_line_problem(info: dict | None = None, torch_cuda: str | None = None) -> str | None:
    """Why this installation's compiled modules do not fit the installed torch, or None: a wheel of one
    CUDA line beside a torch of another (``_cabi.cuda_line_problem``)."""
    return _cabi.cuda_line_problem(PACKAGE, build_info() if info is None else info, torch_cuda)


class Plan:
    """An op call packed once for a signature (shapes, strides, dtypes, devices, scalars): later calls of
    that signature change only the data pointers (``Library.run``)."""

    __slots__ = ("addresses", "fn", "floats", "ints", "library", "name", "slots", "words")

    def __init__(self, library: Library, name: str, tensors, ints, floats) -> None:
        self.library, self.name, self.fn = library, name, library.op(name)
        self.words = array("q")
        for t in tensors:
            self.words.extend(_descriptor(t))
        self.slots = tuple(i * DESC_WORDS for i, t in enumerate(tensors) if t is not None)
        # Read by the C side only, never written: shared by every call of the plan, as are their addresses
        # (the arrays are never resized).
        self.ints, self.floats = array("q", ints or (0,)), array("d", floats or (0.0,))
        self.addresses = (self.ints.buffer_info()[0], self.floats.buffer_info()[0])

    def run(self, tensors, device: int) -> None:
        """The op on ``tensors`` (the plan's tensors that are not None, in order) on ``device``'s stream."""
        words = self.words[:]  # a copy per call: calls from several threads may share the plan
        for slot, t in zip(self.slots, tensors):
            words[slot] = t.data_ptr()
        ret = array("q", _RET_ZEROS)
        ints, floats = self.addresses
        status = self.fn(words.buffer_info()[0], ints, floats, _raw_stream(device), ret.buffer_info()[0])
        if status != 0:
            raise RuntimeError(f"sageattention::{self.name}: {self.library.last_error()}")


def load(module: str) -> tuple[Library | None, str | None]:
    """(Library, None) for ``sageattention.<module>``, or (None, why not); once per module."""
    if module not in _loaded:
        _loaded[module] = _cabi.load_module(PACKAGE, module, cuda_line_problem())
    return _loaded[module]
