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
    and query dims have size 1 or stride 0, ``_checks.mask_kind``), not with ``is_causal``: the fused
    quantization reads each batch entry's kept keys first (``key_order``; K and V gathered so instead,
    ``compact_keys``, where they are not 16-byte aligned) and the kernel attends to as many keys as
    each batch entry keeps.

    Returns (out, lse): out [B, Hq, Nq, D] in q's dtype, stored like q; lse [B, Hq, Nq] float32
    (natural log, including the smooth-K correction) or None. ``check=False`` skips the input checks
    (cuda_common.check_qkv) for a caller that has made them already (sageattention's entry points).
    """
    cuda_common.start_call("sm90", q, k, v, check=check)
    kv_len = order = None
    if key_mask is not None:
        if is_causal:
            raise ValueError("attention_sm90: a key-padding mask cannot be combined with is_causal")
        if _vec_aligned(k) and _vec_aligned(v):  # the quantization reads K and V in the key order
            order, kv_len = key_order(key_mask, k.shape[0], k.shape[2])
            order = order.to(torch.int32)
        else:  # a gathered copy of K and V, the kept keys first
            k, v, kv_len = compact_keys(k, v, key_mask)
    # The LSE correction (return_lse and smooth_k), K's scales per KEY_BLOCK keys and Vᵀ's key padding
    # (a multiple of 16) are the op's own (csrc/bindings.cpp, attn_sm90).
    out, lse = cuda_ops.call("attn_sm90", q, k, v, is_causal, sm_scale, *_op_args(q, sm_scale), smooth_k,
                             return_lse, q.stride(1) < q.stride(2), kv_len, order)  # fmt: skip
    return out, (lse if return_lse else None)


def _vec_aligned(x) -> bool:
    """Whether the fused quantization reads x in 16-byte words (csrc/fused/quant_qkv.cu, vec_aligned): a
    16-byte aligned base and strides of multiples of 8 elements (dims of size 1 aside)."""
    return x.data_ptr() % 16 == 0 and all(s % 8 == 0 or n == 1 for s, n in zip(x.stride()[:3], x.shape[:3]))


def key_order(key_mask, batch: int, nk: int):
    """(order, kv_len): each batch entry's keys, the kept ones first in their order (int64 [B, Nk]), and
    how many it keeps (int32 [B]): attention over keys order[b, :kv_len[b]] is attention under the mask.
    key_mask: bool, broadcastable to [B, H, Nq, Nk], size 1 or stride 0 in its head and query dims. No
    value is read on the host: the call stays asynchronous and capturable."""
    keep = key_mask.reshape((1,) * (4 - key_mask.dim()) + tuple(key_mask.shape))[:, 0, 0, :]
    keep = keep.expand(batch, nk)
    kv_len = keep.sum(dim=-1, dtype=torch.int32)
    return torch.argsort(keep.logical_not().to(torch.uint8), dim=-1, stable=True), kv_len


def compact_keys(k, v, key_mask):
    """(k, v, kv_len) with each batch entry's kept keys first (``key_order``), gathered: what the kernel
    attends to. k, v: HND views [B, Hkv, Nk, D]."""
    b, hkv, nk, d = k.shape
    order, kv_len = key_order(key_mask, b, nk)
    index = order.view(b, 1, nk, 1).expand(b, hkv, nk, d)
    return k.gather(2, index), v.gather(2, index), kv_len


def _op_args(q, sm_scale: float) -> tuple:
    """attn_sm90's scale_mul and d_pad for these inputs."""
    return sm_scale * LOG2E / INT8_MAX, cuda_common.d_pad(q.shape[-1])


def call_plan(q, k, v, *, nhd: bool, is_causal: bool, sm_scale: float, smooth_k: bool, return_lse: bool):
    """What ``attention_sm90(q, k, v, ...)`` computes, for later eager calls of the same signature
    (dispatch.call_plan): a ``cuda_ops.Sm90Call`` that takes the caller's tensors (the [B, N, H, D] ones
    whose transposes q, k and v are, with ``nhd``) and gives the output in their layout; None where the
    module is not loaded. NHD memory in, NHD memory out, as ``attention_sm90``."""
    scale_mul, d_pad = _op_args(q, sm_scale)
    return cuda_ops.sm90_call(q, k, v, is_causal, sm_scale, scale_mul, d_pad, smooth_k, return_lse,
                              q.stride(1) < q.stride(2), nhd)  # fmt: skip


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
