"""Launcher of the sm_90a CUDA attention kernel (csrc/sm90).

One op, ``sageattention::attn_sm90``, runs the whole call: it quantizes Q, K and V with the fused
quantization (csrc/fused/quant_qkv.cu: one kernel launch, two for long sequences, whose CTAs first take
per-chunk statistics of K and V and then quantize all three) into one scratch buffer, and attends with
``qk_int8_sv_f8_attn_sm90``. It gives the bits of the two ops ``quant_qkv_sm90`` and
``qk_int8_sv_f8_attn_sm90`` called one after the other (tests/gpu/test_cuda_kernels.py checks it), with
one allocation for the intermediates and none of them handed to Python (a shorter host path: small
shapes are bound by it). The quantization:

* Q: INT8 per token, its scale carrying ``sm_scale * log2(e)`` (as ``quant_q_per_token``);
* K: minus its mean over tokens (smooth-K, when asked), INT8 per block of 128 keys (as
  ``quant_k_per_block``): the kernel's key step, so one scale covers one step;
* V: FP8 e4m3 per channel (scale ``amax / 448``), transposed to [B, Hkv, d_pad, n_pad] with its keys
  permuted within groups of 16 (as ``quant_v_fp8(..., permute_keys=True)``; see
  ``sageattention.reference.permute_keys_sm90``);
* the attention kernel, whose output is stored like ``q`` (NHD memory for an NHD caller).

The fused op's outputs are bit for bit those of the separate ops given its K mean, which it sums in
an order of its own: it may differ from ``k.mean(dim=2, dtype=torch.float32)`` by float32 rounding.

It computes what ``sage_ref(q, k, v, pv=PVDtype.FP8, block_m=1, block_n=128, rowsum="rounded",
key_parts=key_parts(...), half_exp2_tiles=half_exp2_tiles(head_dim), ...)`` computes (``key_parts``: the
split of the last wave's tiles, below; ``half_exp2_tiles``: the keys whose 448 P it takes in float16).

A CTA of the kernel is one producer warpgroup (TMA loads) and 3 (head dim 128) or 4 (head dim 64)
consumer warpgroups of 64 query rows each (``csrc/sm90/attn_int8_fp8.cu``). Non-causal, the tiles of
its last, partial wave over the GPU's SMs may run in parts over ranges of their key blocks, merged at
the end (``key_parts``: ``sage_ref``'s ``key_parts`` for the call), which keeps the SMs busy to the end.
"""

from __future__ import annotations

import torch

from . import cuda_common, cuda_ops
from .quant import INT8_MAX, LOG2E

__all__ = ["attention_sm90", "half_exp2_tiles", "key_parts", "KEY_BLOCK"]

#: Keys per kernel step and K's INT8 block (one scale per block).
KEY_BLOCK = 128


def attention_sm90(q, k, v, *, is_causal: bool, sm_scale: float, smooth_k: bool, return_lse: bool,
                   check: bool = True, key_mask=None):  # fmt: skip
    """Quantized attention on HND views ([B, H, N, D], any strides with a unit last stride) of
    float16/bfloat16 tensors, D <= 128 and a multiple of 8, Hq a multiple of Hkv.

    ``key_mask``: None, or a key-padding mask (a bool mask broadcastable to [B, Hq, Nq, Nk] whose head
    and query dims have size 1 or stride 0, ``_checks.mask_kind``), not with ``is_causal``: the op puts
    each batch entry's kept keys first (a kernel of its own, before the fused quantization, which then
    reads K and V in that order) and the kernel attends to as many keys as each batch entry keeps.

    Returns (out, lse): out [B, Hq, Nq, D] in q's dtype, stored like q; lse [B, Hq, Nq] float32
    (natural log, including the smooth-K correction) or None. ``check=False`` skips the input checks
    (cuda_common.check_qkv) for a caller that has made them already (sageattention's entry points).
    """
    cuda_common.start_call("sm90", q, k, v, check=check)
    keys = None
    if key_mask is not None:
        if is_causal:
            raise ValueError("attention_sm90: a key-padding mask cannot be combined with is_causal")
        keys = key_rows(key_mask, k.shape[0], k.shape[2])
    # The LSE correction (return_lse and smooth_k), K's scales per KEY_BLOCK keys, Vᵀ's key padding (a
    # multiple of 16) and the key order are the op's own (csrc/bindings.cpp, attn_sm90).
    out, lse = cuda_ops.call("attn_sm90", q, k, v, is_causal, sm_scale, *_op_args(q, sm_scale), smooth_k,
                             return_lse, q.stride(1) < q.stride(2), keys)  # fmt: skip
    return out, (lse if return_lse else None)


def key_rows(key_mask, batch: int, nk: int):
    """A key-padding mask (``attention_sm90``) as the op takes it: a uint8 view [B, Nk] of its memory,
    nonzero where batch entry b keeps key t (no copy: broadcast dims keep a stride of 0)."""
    keep = key_mask.reshape((1,) * (4 - key_mask.dim()) + tuple(key_mask.shape))[:, 0, 0, :]
    return keep.expand(batch, nk).view(torch.uint8)


def _op_args(q, sm_scale: float) -> tuple:
    """attn_sm90's scale_mul and d_pad for these inputs."""
    return sm_scale * LOG2E / INT8_MAX, cuda_common.d_pad(q.shape[-1])


def call_plan(q, k, v, *, nhd: bool, is_causal: bool, sm_scale: float, smooth_k: bool, return_lse: bool,
              key_mask=None):  # fmt: skip
    """What ``attention_sm90(q, k, v, ..., key_mask=key_mask)`` computes, for later eager calls of the
    same signature (dispatch.call_plan): a ``cuda_ops.Sm90Call`` that takes the caller's tensors (the
    [B, N, H, D] ones whose transposes q, k and v are, with ``nhd``; then, with ``key_mask``, a mask of
    its signature, whose memory key_rows views in place) and gives the output in their layout; None where
    the module is not loaded. NHD memory in, NHD memory out, as ``attention_sm90``."""
    scale_mul, d_pad = _op_args(q, sm_scale)
    keys = None if key_mask is None else key_rows(key_mask, k.shape[0], k.shape[2])
    return cuda_ops.sm90_call(q, k, v, is_causal, sm_scale, scale_mul, d_pad, smooth_k, return_lse,
                              q.stride(1) < q.stride(2), nhd, keys)  # fmt: skip


#: The 8-key column tiles of a block (bit c: keys 8c..8c+7) whose 448 P the head-dim-128 kernel computes
#: in float16 (exp2_h2, kH2ExpTiles in csrc/sm90/attn_int8_fp8.cu) where it takes a block without a mask:
#: tiles 7 and 11.
HALF_EXP2_TILES_D128 = 0x0880


def half_exp2_tiles(head_dim: int) -> int:
    """``sage_ref``'s ``half_exp2_tiles`` for the kernel of this head dim (0 at d_pad 64)."""
    return HALF_EXP2_TILES_D128 if cuda_common.d_pad(head_dim) == 128 else 0


def key_parts(batch: int, heads_q: int, nq: int, nk: int, head_dim: int, is_causal: bool, device=None):
    """How many key ranges the kernel splits each query row's keys into, for a call of these sizes on
    ``device`` (the current GPU by default): an int64 tensor [B, Hq, Nq] for ``sage_ref``'s ``key_parts``,
    or None where no tile is split (``sageattention::sm90_split_plan``, csrc/sm90/attn.h)."""
    cuda_common.load_extensions("sm90")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    d_pad = cuda_common.d_pad(head_dim)
    first, parts, rows = cuda_ops.call("sm90_split_plan", batch, heads_q, nq, nk, d_pad, is_causal, sms)
    if parts == 1:
        return None
    tiles_per_head = -(-nq // rows)
    heads = torch.arange(batch * heads_q, device=device).unsqueeze(1)
    tile = heads * tiles_per_head + torch.arange(nq, device=device).unsqueeze(0) // rows
    return torch.where(tile >= first, parts, 1).reshape(batch, heads_q, nq)
