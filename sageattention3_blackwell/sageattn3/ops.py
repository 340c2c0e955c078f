"""The compiled kernels of `sageattn3._C` as torch ops, when this build has the module.

The module exports plain C functions over tensor descriptors (csrc/bindings.cpp, the C ABI that
sageattention's modules export too), loaded with ctypes by ``_cabi`` (copied from the repository's
sageattention/_cabi.py by the build, shared_sources.py says why); this file defines the ops around
them with ``torch.library``, so that one wheel serves every PyTorch from its floor on. Each op is one
function below that allocates the op's outputs from its inputs' shapes and, given the module, launches
on the current stream; without it (``launch=None``) it is the op's fake implementation, the same shapes
without a launch, which ``torch.compile`` traces. The C side checks every argument and names the one
that is wrong (a RuntimeError).

``load()`` defines them once, under ``torch.ops.sageattn3``: ``quant_nvfp4_rows``, ``quant_nvfp4_vt``
(the NVFP4 quantization), ``attn_nvfp4`` (the attention kernel) and ``mma_nvfp4_smoke`` (the FP4 MMA
alone, for the hardware test). ``compiled_families()`` and ``device_family(device)`` say which targets
the module holds and which one a GPU runs. When the module is missing (a pure-Python build, or one that
does not load here), `load_error` says why.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

import torch

try:
    from . import _cabi
except ImportError as exc:  # a source tree whose build never ran: the copy is not there yet
    raise ImportError(
        "sageattn3._cabi is missing: the build copies it from the repository's sageattention/_cabi.py "
        "(sageattention3_blackwell/shared_sources.py); build or install sageattn3, or run "
        "`python sageattention3_blackwell/shared_sources.py` in the checkout"
    ) from exc

PACKAGE, MODULE = "sageattn3", "_C"
load_error: str | None = None
_library: list = []  # [_cabi.Library, torch.library.Library] once loaded
_device_families: dict[int, str | None] = {}

#: Bit of ``compiled_families()`` -> the target it stands for.
FAMILY_BITS = ((1, "sm_100a"), (2, "sm_120a"), (4, "sm_90a"))
#: What the attention kernel does on each target.
ATTENTION_PATHS = {
    "sm_120a": "block-scaled FP4 tensor cores (mma.sync kind::mxf4nvf4, scale_vec::4X)",
    "sm_100a": (
        "FP4 tiles decoded exactly to fp16 in registers, fp16 mma.sync (sm_100a has no block-scaled mma.sync)"
    ),
    "sm_90a": "the sm_100a code built for Hopper (FP4 decoded to fp16, fp16 mma.sync), for testing",
}
#: The compute capability each target's SASS runs on (arch-specific targets run on exactly one).
TARGET_CC = {"sm_90a": (9, 0), "sm_100a": (10, 0), "sm_120a": (12, 0)}

_U8, _F32 = torch.uint8, torch.float32
#: op name -> (schema, function(launch, *args))
OPS: dict[str, tuple[str, Callable]] = {}


def _op(schema: str):
    def define(body: Callable) -> Callable:
        OPS[body.__name__] = (schema, body)
        return body

    return define


def _rows(op: str, x, name: str = "x") -> tuple[int, int, int, int]:
    """The [B, H, N, D] sizes the outputs are read from (every other check is the C side's)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        got = f"{x.dim()} dimensions" if isinstance(x, torch.Tensor) else type(x).__name__
        raise RuntimeError(f"{PACKAGE}::{op}: {name} must be a 4-d tensor [B, H, N, D], got {got}")
    return tuple(x.shape)


def _padded(n: int, block: int) -> int:
    return -(-n // max(block, 1)) * max(block, 1)


@_op("(Tensor x, int block, int mode, Tensor? mean) -> (Tensor, Tensor, Tensor, Tensor)")
def quant_nvfp4_rows(launch, x, block, mode, mean):
    """x [B, H, N, D] -> (codes [B, H, N_pad, D / 2] uint8, scales [B, H, N_pad, D / 16] uint8 (E4M3),
    block scales [B, H, N_pad / block] float32, the per-block mean [B, H, N_pad / block, D] float32 in
    mode 2, else an empty tensor). mode 0: no smoothing; 1: subtract ``mean`` [B, H, D]; 2: subtract each
    block's mean."""
    b, h, n, d = _rows("quant_nvfp4_rows", x)
    n_pad = _padded(n, block)
    blocks = n_pad // max(block, 1)
    codes = x.new_empty((b, h, n_pad, d // 2), dtype=_U8)
    scales = x.new_empty((b, h, n_pad, d // 16), dtype=_U8)
    block_scales = x.new_empty((b, h, blocks), dtype=_F32)
    block_mean = x.new_empty((b, h, blocks, d) if mode == 2 else (0,), dtype=_F32)
    if launch is not None:
        mean_in = mean.contiguous() if mode == 1 and mean is not None else None
        mean_out = block_mean if mode == 2 else None
        launch.call("quant_nvfp4_rows", (x, mean_in, codes, scales, block_scales, mean_out), (block, mode))
    return codes, scales, block_scales, block_mean


@_op("(Tensor v, int block) -> (Tensor, Tensor, Tensor)")
def quant_nvfp4_vt(launch, v, block):
    """v [B, H, N, D] -> Vᵀ (codes [B, H, D, N_pad / 2] uint8, scales [B, H, D, N_pad / 16] uint8, block
    scales [B, H, N_pad / block] float32)."""
    b, h, n, d = _rows("quant_nvfp4_vt", v, "v")
    n_pad = _padded(n, block)
    outputs = (
        v.new_empty((b, h, d, n_pad // 2), dtype=_U8),
        v.new_empty((b, h, d, n_pad // 16), dtype=_U8),
        v.new_empty((b, h, n_pad // max(block, 1)), dtype=_F32),
    )
    if launch is not None:
        launch.call("quant_nvfp4_vt", (v, *outputs), (block,))
    return outputs


@_op("(Tensor q_codes, Tensor q_scales, Tensor q_gs, Tensor k_codes, Tensor k_scales, Tensor k_gs, "
     "Tensor v_codes, Tensor v_scales, Tensor v_gs, Tensor? corr, Tensor? mask, Tensor(a!) out, int nq, "
     "int nk, bool is_causal, float qk_scale, bool return_lse) -> Tensor")  # fmt: skip
def attn_nvfp4(launch, q_codes, q_scales, q_gs, k_codes, k_scales, k_gs, v_codes, v_scales, v_gs, corr, mask,
               out, nq, nk, is_causal, qk_scale, return_lse):  # fmt: skip
    """NVFP4 attention on the quantization ops' outputs: writes ``out`` [B, Hq, Nq, D] and returns the LSE
    [B, Hq, Nq] float32 (natural log, without the K-mean term; an empty tensor unless ``return_lse``).
    mask: None, or [B, Hq, Nq, Nk] (broadcast strides allowed), bool (keep where True), uint8 or float32
    (added to the scores)."""
    b, hq, _, _ = _rows("attn_nvfp4", q_codes, "q_codes")
    lse = q_gs.new_empty((b, hq, nq) if return_lse else (0,), dtype=_F32)
    if launch is not None:
        if mask is not None and mask.dtype == torch.bool:
            mask = mask.view(_U8)  # the same bytes (and strides): keep where nonzero
        tensors = (q_codes, q_scales, q_gs, k_codes, k_scales, k_gs, v_codes, v_scales, v_gs, corr, mask, out,
                   lse if return_lse else None)  # fmt: skip
        launch.call("attn_nvfp4", tensors, (nq, nk, is_causal, return_lse), (qk_scale,))
    return lse


@_op("(Tensor a_codes, Tensor a_scales, Tensor b_codes, Tensor b_scales) -> Tensor")
def mma_nvfp4_smoke(launch, a_codes, a_scales, b_codes, b_scales):
    """One 16x8x64 block-scaled FP4 MMA (sm_120a): out [16, 8] float32 = A (16x64) . B^T (8x64)."""
    out = a_codes.new_empty((16, 8), dtype=_F32)
    if launch is not None:
        launch.call("mma_nvfp4_smoke", (a_codes, a_scales, b_codes, b_scales, out))
    return out


def _define(launch: _cabi.Library) -> torch.library.Library:
    """The ops under torch.ops.sageattn3: a CUDA implementation that launches, and the fake one."""
    lib = torch.library.Library(PACKAGE, "FRAGMENT")
    for name, (schema, body) in OPS.items():
        lib.define(name + schema)

        def real(*args, _body=body):
            return _body(launch, *args)

        def fake(*args, _body=body):
            return _body(None, *args)

        lib.impl(name, real, "CUDA")
        torch.library.register_fake(f"{PACKAGE}::{name}", fake, lib=lib)
    return lib


def load() -> bool:
    """Load the compiled module and define its ops once; True when they are defined."""
    global load_error
    if _library or load_error is not None:
        return bool(_library)
    problem = _cabi.cuda_line_problem(PACKAGE, build_info())
    launch, load_error = _cabi.load_module(PACKAGE, MODULE, problem)
    if launch is not None:
        _library.extend((launch, _define(launch)))
    return launch is not None


def library() -> _cabi.Library | None:
    """The loaded module's functions (``_cabi.Library``), or None where it does not load (``load_error``)."""
    return _library[0] if load() else None


def build_info() -> dict:
    """What the wheel was built with (``_build_info.json``: archs, nvcc, CUDA line, wheel kind); {} in a
    source tree."""
    return _cabi.read_build_info(os.path.dirname(os.path.abspath(__file__)))


def compiled_families() -> list[str]:
    """Targets the extension holds SASS for ('sm_90a', 'sm_100a', 'sm_120a')."""
    if not load():
        return []
    bits = int(_library[0].function("sage_compiled_families", ctypes.c_int, [])())
    return [name for bit, name in FAMILY_BITS if bits & bit]


def device_family(device: torch.device) -> str | None:
    """The compiled target this CUDA device runs ('sm_120a', ...), or None."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _device_families:
        family = None
        if load():
            bits = int(_library[0].function("sage_device_family", ctypes.c_int, [ctypes.c_int64])(index))
            family = next((name for bit, name in FAMILY_BITS if bits > 0 and bits & bit), None)
        _device_families[index] = family
    return _device_families[index]


def unavailable_reason(device: torch.device) -> str | None:
    """None when the compiled kernels run on `device`, else why not."""
    if not load():
        return f"the extension is not built in this install ({load_error})"
    if device_family(device) is None:
        cc = torch.cuda.get_device_capability(device)
        built = ", ".join(compiled_families()) or "no target"
        return f"it was built for {built}; this GPU is sm_{cc[0]}{cc[1]}"
    return None
