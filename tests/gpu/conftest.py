"""Helpers of the mma.sync kernel tests (test_cuda_sm80.py, test_cuda_sm89.py), handed out as the
``mma`` fixture: input makers, the DESIGN.md protocol inputs, and checks whose failure messages say
where the error sits in the kernels' tiling (128-row CTAs of 8 warps x 16 rows; a thread's output
channels are 2 * (lane % 4) + {0, 1} of each 8), which usually tells a mask, a fragment layout, a key
permutation or an unwritten tile apart."""

from __future__ import annotations

import math
import types

import pytest
import torch

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
    """DESIGN.md's accuracy inputs: b=1 h=8 n=4096 d=128 bf16 NHD views. "outlier": K plus a per-channel
    bias N(0, 8^2), four V channels x10, Q x2."""
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
    lines.append("worst 128-row CTAs: " + _top(row_err.amax(dim=-1), ("b", "h", "cta")))
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
    """Namespace of the helpers above: make, protocol_inputs, poison_allocator, where_it_differs,
    check_tight, check_exact, check_lse."""
    return types.SimpleNamespace(
        make=make,
        protocol_inputs=protocol_inputs,
        poison_allocator=poison_allocator,
        where_it_differs=where_it_differs,
        check_tight=check_tight,
        check_exact=check_exact,
        check_lse=check_lse,
    )
