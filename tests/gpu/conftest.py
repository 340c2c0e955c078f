"""Helpers of the GPU tests, handed out as fixtures:

* ``mma``: the helpers of the compiled kernel tests (test_cuda_kernels.py), also used elsewhere:
  input makers, the accuracy protocol's inputs (README, Accuracy), and checks whose failure messages
  say where the error sits in the kernels' tiling (128-row tiles of 8 warps x 16 rows; the sm_90a
  kernel's warpgroups of 4 warps hold 64 rows each; a thread's output channels are 2 * (lane % 4) +
  {0, 1} of each 8), which usually tells a mask, a fragment layout, a key permutation or an
  unwritten tile apart.
* ``sage_backend``: parametrizes a test over every quantized entry point (``sageattn`` and the named
  variants), skipping those that cannot run on this GPU, with the ``sage_ref`` options that
  reproduce each one's quantization.
* ``hold_stream``: keeps a stream busy for a while, to show what waits for it and what does not.
"""

from __future__ import annotations

import importlib
import math
import os
import types
from dataclasses import dataclass

import pytest
import torch

import sageattention
from sageattention import cuda_sm90, dispatch
from sageattention._checks import MAX_HEAD_DIM
from sageattention.quant import PVDtype

CTA_ROWS = 128  # query rows per CTA
WARP_ROWS = 16  # query rows per warp


def make(b, h, n, d, layout, dtype, seed, scale=1.0):
    """A [B, H, N, D] view; NHD memory when layout == "NHD"."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (b, h, n, d) if layout == "HND" else (b, n, h, d)
    x = torch.randn(shape, device="cuda", generator=gen) * scale
    x = x.to(dtype)
    return x if layout == "HND" else x.transpose(1, 2)


def protocol_inputs(kind: str, seed: int):
    """The accuracy protocol's inputs (README, Accuracy): b=1 h=8 n=4096 d=128 bf16 NHD views.
    "outlier": K plus a per-channel bias N(0, 8^2), four V channels x10, Q x2."""
    q, k, v = (make(1, 8, 4096, 128, "NHD", torch.float32, seed + i) for i in range(3))
    if kind == "outlier":
        gen = torch.Generator(device="cuda").manual_seed(seed + 3)
        k = k + 8.0 * torch.randn(128, device="cuda", generator=gen)
        v = v.clone()
        v[..., :4] *= 10.0
        q = q * 2.0
    elif kind != "randn":
        raise ValueError(kind)
    return tuple(x.to(torch.bfloat16) for x in (q, k, v))


def poison_allocator(*shapes_dtypes):
    """Hand NaN-filled blocks of these sizes back to the caching allocator, so the kernel's
    torch.empty outputs most likely start as NaN: a row or channel it forgets to write shows."""
    blocks = [torch.full(shape, math.nan, dtype=dtype, device="cuda") for shape, dtype in shapes_dtypes]
    del blocks


def fill_freed_blocks(byte_sizes, value=255):
    """Hand blocks of these sizes in bytes, every byte `value`, back to the caching allocator, so that
    torch.empty buffers of the next calls most likely start so (0xFF is NaN in float32 and e4m3fn, -1
    in int8): a slot that a kernel forgets to write, or reads before writing, shows."""
    blocks = [torch.full((size,), value, dtype=torch.uint8, device="cuda") for size in byte_sizes]
    del blocks


def kernels_on_gpu(fn) -> list[str]:
    """The names of the kernels one call of `fn` runs on the GPU, in order (torch.profiler), after a call
    outside the profiler (loading, compiling)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA]
    return [ev.name for ev in sorted(events, key=lambda ev: ev.time_range.start)]


def compact_keys(k, v, key_mask):
    """(k, v, kv_len): k and v [B, Hkv, Nk, D] with each batch entry's kept keys first, in order, under a
    key-padding mask (bool, broadcastable to [B, H, Nq, Nk] with one row of keys per batch entry), and the
    kept counts: what the sm_90a kernel attends to."""
    b, hkv, nk, d = k.shape
    keep = cuda_sm90.key_rows(key_mask, b, nk).bool()
    order = torch.argsort(keep.logical_not().to(torch.uint8), dim=-1, stable=True)
    index = order.view(b, 1, nk, 1).expand(b, hkv, nk, d)
    return k.gather(2, index), v.gather(2, index), keep.sum(dim=-1)


def _nan_as_inf(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isnan(x), math.inf, x)


def _top(values: torch.Tensor, names, k=4) -> str:
    flat = values.flatten()
    k = min(k, flat.numel())
    top = torch.topk(_nan_as_inf(flat), k)
    parts = []
    for val, idx in zip(top.values.tolist(), top.indices.tolist()):
        coords = torch.unravel_index(torch.tensor(idx), values.shape)
        parts.append(", ".join(f"{n}={int(c)}" for n, c in zip(names, coords)) + f": {val:.4g}")
    return "; ".join(parts)


def where_it_differs(out: torch.Tensor, ref: torch.Tensor) -> str:
    """Where |out - ref| is large, for [B, H, N, D] tensors (HND views), in the kernels' terms."""
    o, r = out.double(), ref.double()
    err = (o - r).abs()
    b, h, n, d = err.shape
    lines = [f"shape [B, H, N, D] = {list(err.shape)}, max|ref| = {r.abs().max().item():.4g}"]
    nan = torch.isnan(o)
    if nan.any():
        rows = nan.any(dim=-1).nonzero().tolist()
        chans = nan.any(dim=(0, 1, 2)).nonzero().flatten().tolist()
        lines.append(f"NaN in {int(nan.sum())} elements; (b, h, row) of the first: {rows[:6]}")
        lines.append(f"channels holding NaN: {chans[:16]}")
        err = _nan_as_inf(err)
    flat = int(torch.argmax(err.flatten()))
    bi, hi, ni, di = (int(c) for c in torch.unravel_index(torch.tensor(flat), err.shape))
    lines.append(
        f"worst element b={bi} h={hi} row={ni} (CTA {ni // CTA_ROWS}, warp {ni % CTA_ROWS // WARP_ROWS}, "
        f"row {ni % WARP_ROWS} of its 16) channel={di}: out={o[bi, hi, ni, di].item():.5g} "
        f"ref={r[bi, hi, ni, di].item():.5g}"
    )
    lines.append("worst (b, h): " + _top(err.amax(dim=(2, 3)), ("b", "h")))
    row_err = torch.nn.functional.pad(err.amax(dim=-1), (0, (-n) % CTA_ROWS)).view(b, h, -1, CTA_ROWS)
    lines.append("worst 128-row tiles: " + _top(row_err.amax(dim=-1), ("b", "h", "cta")))
    by_warp = row_err.amax(dim=(0, 1, 2)).view(-1, WARP_ROWS).amax(dim=-1).tolist()
    lines.append("max error by warp of a CTA: " + " ".join(f"{x:.2g}" for x in by_warp))
    in_warp = row_err.amax(dim=(0, 1, 2)).view(-1, WARP_ROWS).amax(dim=0).tolist()
    lines.append(
        "max error by row of a warp's 16 (0-7: accumulator c0/c1, 8-15: c2/c3): "
        + " ".join(f"{x:.2g}" for x in in_warp)
    )
    by_chan = err.amax(dim=(0, 1, 2))
    by_chan8 = torch.nn.functional.pad(by_chan, (0, (-d) % 8)).view(-1, 8).amax(dim=0).tolist()
    lines.append(
        "max error by channel mod 8 (lane % 4 owns 2q, 2q+1): " + " ".join(f"{x:.2g}" for x in by_chan8)
    )
    lines.append("worst channels: " + _top(by_chan, ("channel",), k=6))
    return "\n".join(lines)


def check_tight(metrics, out, ref, pv: PVDtype, what="vs sage_ref"):
    """conftest's tight bound for this P·V precision, with the error pattern on failure."""
    try:
        metrics.assert_finite(out)
        return metrics.assert_tight(out, ref, pv, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{where_it_differs(out, ref)}") from None


def check_exact(metrics, out, ref, pv: PVDtype, what="vs float64"):
    """conftest's float64 bound for this P·V precision, with the error pattern on failure."""
    try:
        metrics.assert_finite(out)
        return metrics.assert_exact(out, ref, pv, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{where_it_differs(out, ref)}") from None


def check_lse(lse, ref_lse, atol, what="lse", rtol=0.0):
    try:
        assert not torch.isnan(lse).any(), f"NaN in {what}"
        torch.testing.assert_close(lse.double(), ref_lse.double(), rtol=rtol, atol=atol)
    except AssertionError as exc:
        err = _nan_as_inf((lse.double() - ref_lse.double()).abs())
        raise AssertionError(f"{what}: {exc}\nworst (b, h, row): {_top(err, ('b', 'h', 'row'))}") from None


@pytest.fixture(scope="session")
def mma():
    """Namespace of the helpers above: make, protocol_inputs, poison_allocator, fill_freed_blocks,
    kernels_on_gpu, compact_keys, where_it_differs, check_tight, check_exact, check_lse."""
    return types.SimpleNamespace(
        make=make,
        protocol_inputs=protocol_inputs,
        poison_allocator=poison_allocator,
        fill_freed_blocks=fill_freed_blocks,
        kernels_on_gpu=kernels_on_gpu,
        compact_keys=compact_keys,
        where_it_differs=where_it_differs,
        check_tight=check_tight,
        check_exact=check_exact,
        check_lse=check_lse,
    )


# --------------------------------------------------------------------------------------------------
# The quantized entry points, for tests parametrized over all of them


@dataclass(frozen=True)
class SageBackend:
    """One quantized entry point and what it needs to run.

    ``name`` is "sageattn" (whatever dispatch picks on this GPU) or the dispatch name of the backend
    a named variant forces; ``function`` its name in ``sageattention``; ``pv`` its P·V precision (None
    for sageattn, see ``resolve``); ``modules`` the compiled extensions it needs; ``key_block`` K's
    quantization block of a compiled kernel (the Triton kernels' comes from
    ``sageattention.triton.launch``); ``rowsum`` what its softmax divides by (``sage_ref``'s option).
    """

    name: str
    function: str
    pv: PVDtype | None
    masks: bool
    min_capability: tuple[int, int]
    exact_capability: tuple[int, int] | None = None
    modules: tuple[str, ...] = ()
    key_block: int | None = None
    rowsum: str = "exact"

    @property
    def compiled(self) -> bool:
        return bool(self.modules)

    def call(self, *args, **kwargs):
        return getattr(sageattention, self.function)(*args, **kwargs)

    def resolve(self, has_mask: bool = False) -> SageBackend:
        """The backend that serves a call on the current GPU: itself, or for sageattn the one
        dispatch picks (itself again when that is torch SDPA)."""
        if self.pv is not None:
            return self
        request = dispatch.make_request(
            "cuda", torch.cuda.current_device(), torch.bfloat16, MAX_HEAD_DIM, has_mask
        )  # fmt: skip
        entry, _ = dispatch.decide(request)
        return _BACKENDS_BY_NAME.get(entry.backend.name, self)

    def reference_options(
        self, head_dim: int, has_mask: bool = False, *, shape: tuple[int, int, int, int] | None = None,
        causal: bool = False,
    ) -> dict:  # fmt: skip
        """The ``sage_ref`` keyword arguments that reproduce this backend's quantization. The compiled
        kernels hand head dims that are not a multiple of 8 to the Triton kernels of their P·V
        precision (ops.cuda_attention). ``shape`` (B, Hq, Nq, Nk) and ``causal`` describe the call:
        with them, the split tiles of the sm_90a kernel (``key_parts``) are reproduced too; its keys whose
        448 P it computes in float16 (``half_exp2_tiles``) always."""
        backend = self.resolve(has_mask)
        if not backend.compiled or head_dim % 8:
            from sageattention.triton.launch import reference_options  # noqa: PLC0415 - needs triton

            return reference_options(backend.pv, head_dim)
        # Q per token; K per kernel step; two INT8 digits of K with FP16 P·V (cuda_sm80)
        options = {
            "pv": backend.pv,
            "block_m": 1,
            "block_n": backend.key_block,
            "k_residual": backend.pv is PVDtype.FP16,
            "rowsum": backend.rowsum,
        }
        if backend.name == "cuda_sm90":
            from sageattention import cuda_sm90  # noqa: PLC0415 - needs the compiled module

            options["half_exp2_tiles"] = cuda_sm90.half_exp2_tiles(head_dim)
            parts = cuda_sm90.key_parts(*shape, head_dim, causal) if shape is not None else None
            if parts is not None:
                options["key_parts"] = parts
        return options

    def skip_reason(self) -> str | None:
        """Why this entry point cannot run on the current GPU, or None."""
        if not torch.cuda.is_available():
            return "needs a CUDA GPU"
        capability = torch.cuda.get_device_capability()
        arch = f"sm{capability[0]}{capability[1]}"
        if self.exact_capability is not None and capability != self.exact_capability:
            return f"needs sm{self.exact_capability[0]}{self.exact_capability[1]}, this GPU is {arch}"
        if capability < self.min_capability:
            return f"needs sm{self.min_capability[0]}{self.min_capability[1]} or newer, this GPU is {arch}"
        for module in self.modules:
            try:
                importlib.import_module(f"sageattention.{module}")
            except ImportError as exc:
                return f"sageattention.{module} is not built: {exc}"
        if not self.compiled:
            try:
                importlib.import_module("sageattention.triton")
            except ImportError as exc:
                return f"the Triton kernels cannot be imported: {exc}"
        if self.pv is None and self.resolve().pv is None:
            return f"sageattn runs torch SDPA (not quantized) on this {arch} GPU"
        return None


_FP16, _FP8 = PVDtype.FP16, PVDtype.FP8
SAGE_BACKENDS = (
    SageBackend("sageattn", "sageattn", None, masks=True, min_capability=(8, 0)),
    SageBackend("triton_fp16", "sageattn_qk_int8_pv_fp16_triton", _FP16, masks=True, min_capability=(8, 0)),
    SageBackend("triton_fp8", "sageattn_qk_int8_pv_fp8_triton", _FP8, masks=True, min_capability=(8, 9)),
    SageBackend(
        "cuda_sm80",
        "sageattn_qk_int8_pv_fp16_cuda",
        _FP16,
        masks=False,
        min_capability=(8, 0),
        modules=("_qattn_sm80", "_fused"),
        key_block=64,
    ),
    SageBackend(
        "cuda_sm89",
        "sageattn_qk_int8_pv_fp8_cuda",
        _FP8,
        masks=False,
        min_capability=(8, 9),
        modules=("_qattn_sm89", "_fused"),
        key_block=64,
    ),
    SageBackend(
        "cuda_sm90",
        "sageattn_qk_int8_pv_fp8_cuda_sm90",
        _FP8,
        masks=False,
        min_capability=(9, 0),
        exact_capability=(9, 0),
        modules=("_qattn_sm90", "_fused"),
        key_block=128,
        rowsum="rounded",
    ),
)
_BACKENDS_BY_NAME = {b.name: b for b in SAGE_BACKENDS}


@pytest.fixture(params=SAGE_BACKENDS, ids=[b.name for b in SAGE_BACKENDS])
def sage_backend(request) -> SageBackend:
    """Each quantized entry point in turn (a SageBackend): sageattn, the Triton FP16 and FP8 P·V
    variants and the compiled sm80, sm89 and sm90 kernels; skipped where it cannot run (arch, not
    built, no Triton). A test narrows the set by name:
    ``@pytest.mark.parametrize("sage_backend", ["cuda_sm80", ...], indirect=True)``."""
    backend = request.param
    if not isinstance(backend, SageBackend):
        backend = _BACKENDS_BY_NAME[backend]
    why = backend.skip_reason()
    if why:
        pytest.skip(why)
    return backend


# --------------------------------------------------------------------------------------------------
# A busy stream

#: torch.cuda._sleep spins one GPU thread for this many clock cycles: about 0.25 s at 2 GHz, far longer
#: than one call of the tests that use it (a few ms) and their checks.
SLEEP_CYCLES = 500_000_000


@pytest.fixture
def hold_stream():
    """hold_stream(device=None) queues a spin of SLEEP_CYCLES on the current stream of ``device`` (the
    current device when None) and returns at once; work queued behind it waits, work on other
    streams does not. Skips under CUDA_LAUNCH_BLOCKING=1, where every launch waits for the GPU."""
    if os.environ.get("CUDA_LAUNCH_BLOCKING") == "1":
        pytest.skip("CUDA_LAUNCH_BLOCKING=1: every launch waits for the GPU")

    def hold(device=None):
        with torch.cuda.device(device):
            torch.cuda._sleep(SLEEP_CYCLES)

    return hold
