"""Merging partial attention results: the LSE contract that ring and sequence-parallel attention need.

Attention of the same queries over chunks of the keys and values, each call with ``return_lse=True``,
merges into the attention over all of them: ``lse = logsumexp_i lse_i`` and ``out = sum_i exp(lse_i -
lse) * out_i``. ``merge_attention`` does that in float32, with gradients through every part's output
and LSE; rows no chunk gives a key to (every ``lse_i`` is -inf) give 0 and an LSE of -inf.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["merge_attention"]


def merge_attention(outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor], tensor_layout: str = "HND"):
    """Merge the results of attention over chunks of the keys (same queries, disjoint keys).

    ``outs``: each chunk's output, [B, H, N, D] for ``"HND"`` or [B, N, H, D] for ``"NHD"``; ``lses``: each
    chunk's LSE, float32 [B, H, N] (what ``sageattn(..., return_lse=True)`` returns). Returns (out, lse):
    out float32 in the outputs' layout, lse float32 [B, H, N]."""
    if tensor_layout not in ("HND", "NHD"):
        raise ValueError(f"tensor_layout={tensor_layout!r} is not supported; valid values: 'HND', 'NHD'")
    if len(outs) == 0 or len(outs) != len(lses):
        raise ValueError(
            f"merge_attention needs one LSE per output, at least one; got {len(outs)} and {len(lses)}"
        )
    stacked = torch.stack([x.float() for x in lses])
    lse = torch.logsumexp(stacked, dim=0)
    finite = torch.where(lse == -math.inf, 0.0, lse)  # rows without any key: every weight 0, not NaN
    out = 0
    for o, part in zip(outs, stacked):
        w = torch.exp(part - finite).unsqueeze(-1)  # [B, H, N, 1]
        out = out + (w if tensor_layout == "HND" else w.transpose(1, 2)) * o.float()
    return out, lse
