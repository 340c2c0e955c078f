"""Triton kernels that quantize Q, K and V to NVFP4 (same bits as `sageattn3.reference`).

Outputs are padded to whole blocks (zeros), so the attention kernel loads them without masks:
Q and K codes [B, H, N_pad, D // 2] and group scales [B, H, N_pad, D // 16] (E4M3 bytes);
V^T codes [B, H, D, N_pad // 2] and scales [B, H, D, N_pad // 16]; block scales [B, H, nblk].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..reference import Q_BLOCK
from .nvfp4 import FP4_E4M3_RANGE, div_rn, e4m3_encode, pack_codes, quantize_groups

#: Smoothing of the rows before quantization.
MODE_PLAIN = 0  # no smoothing (Q without per-block mean)
MODE_SUB_MEAN = 1  # subtract a given [B, H, D] mean (K)
MODE_BLOCK_MEAN = 2  # compute and subtract the block's own mean, and store it (Q)


@triton.jit
def _load_rows(X, MEAN, mean_row, base, stride_n, rows, N, D: tl.constexpr, MODE: tl.constexpr):
    """Rows of X (float32, zero beyond N), smoothed by the mean at ``MEAN + mean_row * D``."""
    cols = tl.arange(0, D)
    valid = rows[:, None] < N
    x = tl.load(base + rows[:, None].to(tl.int64) * stride_n + cols[None, :], mask=valid, other=0.0).to(
        tl.float32
    )
    if MODE != 0:
        mean = tl.load(MEAN + mean_row * D + cols)
        x = tl.where(valid, x - mean[None, :], 0.0)
    return x


@triton.jit
def _quant_rows_kernel(
    X,
    CODES,
    SCALES,
    GS,
    MEAN,
    stride_b,
    stride_h,
    stride_n,
    N,
    N_PAD,
    H,
    D: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
    MODE: tl.constexpr,
):
    """One block of BLOCK rows of X[b, h] -> NVFP4 along D with one float32 block scale.

    The block is walked in chunks of CHUNK rows (mean, then amax, then quantization): whole
    128x128 tiles of this elementwise code took ptxas ~20 s to compile.
    """
    blk = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    nblk = tl.num_programs(0)
    cols = tl.arange(0, D)
    base = X + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
    mean_row = bh.to(tl.int64)  # K: MEAN is [B, H, D]
    if MODE == 2:
        mean_row = bh.to(tl.int64) * nblk + blk  # Q: MEAN is [B, H, nblk, D], written here
        total = tl.zeros((D,), tl.float32)
        for c in range(0, BLOCK, CHUNK):
            rows = blk * BLOCK + c + tl.arange(0, CHUNK)
            total += tl.sum(_load_rows(X, MEAN, 0, base, stride_n, rows, N, D, 0), axis=0)
        count = tl.minimum(N - blk * BLOCK, BLOCK).to(tl.float32)
        tl.store(MEAN + mean_row * D + cols, div_rn(total, tl.full((D,), 1.0, tl.float32) * count))
        tl.debug_barrier()  # the mean is read back below by other threads
    amax = tl.zeros((CHUNK,), tl.float32)
    for c in range(0, BLOCK, CHUNK):
        rows = blk * BLOCK + c + tl.arange(0, CHUNK)
        amax = tl.maximum(
            amax, tl.max(tl.abs(_load_rows(X, MEAN, mean_row, base, stride_n, rows, N, D, MODE)), 1)
        )
    g = div_rn(tl.max(amax, axis=0), FP4_E4M3_RANGE)
    tl.store(GS + bh.to(tl.int64) * nblk + blk, g)
    for c in range(0, BLOCK, CHUNK):
        rows = blk * BLOCK + c + tl.arange(0, CHUNK)
        x = _load_rows(X, MEAN, mean_row, base, stride_n, rows, N, D, MODE)
        codes, sf = quantize_groups(x, g, CHUNK, D)
        row_off = bh.to(tl.int64) * N_PAD + rows[:, None]
        tl.store(CODES + row_off * (D // 2) + tl.arange(0, D // 2)[None, :], pack_codes(codes, CHUNK, D))
        sf_bytes = e4m3_encode(sf).to(tl.uint8)
        tl.store(SCALES + row_off * (D // 16) + tl.arange(0, D // 16)[None, :], sf_bytes)


@triton.jit
def _quant_vt_kernel(
    X,
    CODES,
    SCALES,
    GS,
    stride_b,
    stride_h,
    stride_n,
    N,
    N_PAD,
    H,
    D: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """One block of BLOCK tokens of V[b, h] -> V^T in NVFP4 along tokens (CHUNK channels at a time)."""
    blk = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    rows = blk * BLOCK + tl.arange(0, BLOCK)
    base = X + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
    amax = tl.zeros((CHUNK,), tl.float32)
    for c in range(0, D, CHUNK):
        cols = c + tl.arange(0, CHUNK)
        x = tl.load(
            base + rows[None, :].to(tl.int64) * stride_n + cols[:, None], mask=rows[None, :] < N, other=0.0
        )
        amax = tl.maximum(amax, tl.max(tl.abs(x.to(tl.float32)), axis=1))
    g = div_rn(tl.max(amax, axis=0), FP4_E4M3_RANGE)
    tl.store(GS + bh.to(tl.int64) * tl.num_programs(0) + blk, g)
    for c in range(0, D, CHUNK):
        cols = c + tl.arange(0, CHUNK)
        xt = tl.load(
            base + rows[None, :].to(tl.int64) * stride_n + cols[:, None], mask=rows[None, :] < N, other=0.0
        )
        codes, sf = quantize_groups(xt.to(tl.float32), g, CHUNK, BLOCK)  # [CHUNK channels, BLOCK tokens]
        chan = bh.to(tl.int64) * D + cols[:, None]
        tl.store(
            CODES + chan * (N_PAD // 2) + blk * (BLOCK // 2) + tl.arange(0, BLOCK // 2)[None, :],
            pack_codes(codes, CHUNK, BLOCK),
        )
        tl.store(
            SCALES + chan * (N_PAD // 16) + blk * (BLOCK // 16) + tl.arange(0, BLOCK // 16)[None, :],
            e4m3_encode(sf).to(tl.uint8),
        )


def _pad(n: int, block: int) -> int:
    return -(-n // block) * block


def _check(x: torch.Tensor) -> None:
    if x.stride(-1) != 1:
        raise ValueError("the last dimension must be contiguous")


def token_mean(x: torch.Tensor) -> torch.Tensor:
    """Float32 mean over tokens of an HND tensor [B, H, N, D] -> [B, H, D] (torch reduction: one
    read of K, no float32 copy)."""
    return torch.mean(x, dim=2, dtype=torch.float32)


def quantize_rows(x: torch.Tensor, block: int, mode: int, mean: torch.Tensor | None = None):
    """NVFP4 along D of an HND tensor. Returns (codes, scales as uint8, block scales, mean)."""
    _check(x)
    b, h, n, d = x.shape
    n_pad = _pad(n, block)
    nblk = n_pad // block
    codes = torch.empty((b, h, n_pad, d // 2), device=x.device, dtype=torch.uint8)
    scales = torch.empty((b, h, n_pad, d // 16), device=x.device, dtype=torch.uint8)
    gs = torch.empty((b, h, nblk), device=x.device, dtype=torch.float32)
    if mode == MODE_BLOCK_MEAN:
        mean = torch.empty((b, h, nblk, d), device=x.device, dtype=torch.float32)
    dummy = gs if mean is None else mean
    _quant_rows_kernel[(nblk, b * h)](
        x, codes, scales, gs, dummy, x.stride(0), x.stride(1), x.stride(2), n, n_pad, h,
        D=d, BLOCK=block, CHUNK=32, MODE=mode, num_warps=4,
    )  # fmt: skip
    return codes, scales, gs, mean


def quantize_q(q: torch.Tensor, per_block_mean: bool):
    return quantize_rows(q, Q_BLOCK, MODE_BLOCK_MEAN if per_block_mean else MODE_PLAIN)


def quantize_k(k: torch.Tensor, block_n: int):
    k_mean = token_mean(k)
    return quantize_rows(k, block_n, MODE_SUB_MEAN, k_mean)


def quantize_vt(v: torch.Tensor, block_n: int):
    """V [B, H, N, D] -> (V^T codes, scales as uint8, block scales)."""
    _check(v)
    b, h, n, d = v.shape
    n_pad = _pad(n, block_n)
    nblk = n_pad // block_n
    codes = torch.empty((b, h, d, n_pad // 2), device=v.device, dtype=torch.uint8)
    scales = torch.empty((b, h, d, n_pad // 16), device=v.device, dtype=torch.uint8)
    gs = torch.empty((b, h, nblk), device=v.device, dtype=torch.float32)
    _quant_vt_kernel[(nblk, b * h)](
        v,
        codes,
        scales,
        gs,
        v.stride(0),
        v.stride(1),
        v.stride(2),
        n,
        n_pad,
        h,
        D=d,
        BLOCK=block_n,
        CHUNK=16,
        num_warps=4,
    )
    return codes, scales, gs
