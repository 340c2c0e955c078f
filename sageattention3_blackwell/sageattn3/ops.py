"""Loads the compiled extension (`sageattn3._C`) if this build has one.

Importing it registers the ops under ``torch.ops.sageattn3``: the NVFP4 quantization kernels
(``quant_nvfp4_rows``, ``quant_nvfp4_vt``), the attention kernel (``attn_nvfp4``), the FP4 MMA smoke
test and ``compiled_families`` / ``device_family``. When it is missing (a pure-Python build, or an
import error), `load_error` says why. The quantization and attention ops get fake implementations,
so ``torch.compile`` can trace them.
"""

from __future__ import annotations

import importlib

import torch

load_error: str | None = None
_loaded = False
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


def load() -> bool:
    """Import the extension once; True when its ops are registered."""
    global load_error, _loaded
    if _loaded or load_error is not None:
        return _loaded
    try:
        importlib.import_module("sageattn3._C")
    except ImportError as exc:  # no compiled module in this build, or it does not load here
        load_error = f"{type(exc).__name__}: {exc}"
        return False
    _register_fakes()
    _loaded = True
    return True


def compiled_families() -> list[str]:
    """Targets the extension holds SASS for ('sm_90a', 'sm_100a', 'sm_120a')."""
    if not load():
        return []
    bits = int(torch.ops.sageattn3.compiled_families())
    return [name for bit, name in FAMILY_BITS if bits & bit]


def device_family(device: torch.device) -> str | None:
    """The compiled target this CUDA device runs ('sm_120a', ...), or None."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _device_families:
        family = None
        if load():
            with torch.cuda.device(index):
                bits = int(torch.ops.sageattn3.device_family())
            family = next((name for bit, name in FAMILY_BITS if bits & bit), None)
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


def _register_fakes() -> None:
    def rows_fake(x, block, mode, mean):
        b, h, n, d = x.shape
        n_pad = -(-n // block) * block
        codes = x.new_empty((b, h, n_pad, d // 2), dtype=torch.uint8)
        scales = x.new_empty((b, h, n_pad, d // 16), dtype=torch.uint8)
        gs = x.new_empty((b, h, n_pad // block), dtype=torch.float32)
        out_mean = x.new_empty((b, h, n_pad // block, d) if mode == 2 else (0,), dtype=torch.float32)
        return codes, scales, gs, out_mean

    def vt_fake(v, block):
        b, h, n, d = v.shape
        n_pad = -(-n // block) * block
        return (
            v.new_empty((b, h, d, n_pad // 2), dtype=torch.uint8),
            v.new_empty((b, h, d, n_pad // 16), dtype=torch.uint8),
            v.new_empty((b, h, n_pad // block), dtype=torch.float32),
        )

    def attn_fake(
        qc, qs, qg, kc, ks, kg, vc, vs, vg, corr, mask, out, nq, nk, is_causal, qk_scale, return_lse
    ):
        shape = (qc.shape[0], qc.shape[1], nq) if return_lse else (0,)
        return qg.new_empty(shape, dtype=torch.float32)

    for name, fn in (("quant_nvfp4_rows", rows_fake), ("quant_nvfp4_vt", vt_fake), ("attn_nvfp4", attn_fake)):
        torch.library.register_fake(f"sageattn3::{name}")(fn)
