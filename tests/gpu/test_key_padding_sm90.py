"""Key-padding masks on the sm_90a kernel: bool masks with one row of keys per batch entry, broadcast over
the heads and the queries ([B, 1, 1, Nk], [1, Nk], [Nk] as [1, 1, Nk], expanded views), without
is_causal. sageattn routes them to the kernel: the op puts each batch entry's kept keys first (its
key_order_kernel, csrc/fused/quant_qkv.cu), the fused quantization reads K and V in that order (16-byte
loads or, for K and V off 16-byte alignment, 2-byte ones), and the attention attends to the first
kv_len[b] of them.

Checked, on awkward lengths (more keys than the key-order kernel's 1024-key chunk among them), GQA,
both layouts, aligned and unaligned K and V, and batch entries that keep no key at all:
* the launches: the key order, the quantization and the attention, no sort or gather of torch's;
* against sage_ref on the compacted inputs with the prefix mask, with the kernel's quantization: the
  tight bound of the sm_90a kernel (the same computation up to float32 rounding);
* against float64 attention_ref with the mask: the FP8 bound of unmasked calls (conftest EXACT_BOUNDS);
* the LSE against float64 (-inf where a batch entry keeps no key, whose rows are 0);
* masks the kernel does not take (with is_causal, per-query rows, additive) go to the Triton kernels.
"""

from __future__ import annotations

import math

import pytest
import torch

import sageattention as sa
from sageattention import cuda_sm90, dispatch
from sageattention._checks import KEY_PADDING_MASK, mask_kind
from sageattention.quant import PVDtype
from sageattention.reference import attention_ref, sage_ref

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs an sm_90 GPU", allow_module_level=True)

LSE_ATOL = 5e-2  # tests/gpu/test_lse_merge_gpu.py: the first rows keep the INT8 error of few scores
SM90 = "attn_int8_fp8_sm90"


def _keep(b, nk, seed, kind):
    """[B, Nk] bool: random keys kept, a prefix, or a batch entry that keeps none (the first)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if kind == "prefix":
        lengths = torch.randint(1, nk + 1, (b, 1), device="cuda", generator=gen)
        return torch.arange(nk, device="cuda") < lengths
    keep = torch.rand(b, nk, device="cuda", generator=gen) < 0.7
    if kind == "empty_entry":
        keep[0] = False
    return keep


def _mask_form(keep, form, hq, nq):
    b, nk = keep.shape
    if form == "b11n":
        return keep.view(b, 1, 1, nk)
    if form == "expanded":
        return keep.view(b, 1, 1, nk).expand(b, hq, nq, nk)
    return keep[:1].view(1, nk) if form == "1n" else keep[:1].view(1, 1, nk)  # one row for every entry


CASES = [  # b, hq, hkv, nq, nk, d, keep kind, mask form
    (2, 4, 4, 113, 1000, 128, "random", "b11n"),
    (3, 8, 2, 1000, 4095, 64, "empty_entry", "b11n"),
    (2, 4, 2, 17, 113, 128, "prefix", "expanded"),
    (1, 4, 4, 1, 17, 128, "random", "1n"),
    (2, 6, 3, 4095, 1000, 72, "random", "1nn"),
    (2, 8, 8, 2048, 2048, 128, "prefix", "b11n"),
]


def _unaligned(x):
    """The same values at a base 2 bytes off 16-byte alignment (a view into a wider tensor)."""
    wide = torch.zeros(*x.shape[:-1], x.shape[-1] + 8, device=x.device, dtype=x.dtype)
    wide[..., 1 : 1 + x.shape[-1]] = x
    return wide[..., 1 : 1 + x.shape[-1]]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
def test_key_padding_on_the_sm90_kernel(metrics, mma, case, layout, aligned):
    b, hq, hkv, nq, nk, d, kind, form = case
    q = mma.make(b, hq, nq, d, layout, torch.bfloat16, 0)
    k = mma.make(b, hkv, nk, d, layout, torch.bfloat16, 1)
    v = mma.make(b, hkv, nk, d, layout, torch.bfloat16, 2)
    if not aligned:
        k, v = _unaligned(k), _unaligned(v)
    assert (k.data_ptr() % 16 == 0) == aligned
    keep = _keep(b, nk, 3, kind)
    if form in ("1n", "1nn"):  # one row of keys for every batch entry
        keep = keep[:1].expand(b, nk)
    mask = _mask_form(keep, form, hq, nq)
    assert mask_kind(mask, False) == KEY_PADDING_MASK
    caller = [x.transpose(1, 2) if layout == "NHD" else x for x in (q, k, v)]
    out, lse = sa.sageattn(*caller, tensor_layout=layout, attn_mask=mask, return_lse=True)
    if layout == "NHD":
        out = out.transpose(1, 2)
    names = mma.kernels_on_gpu(lambda: sa.sageattn(*caller, tensor_layout=layout, attn_mask=mask))
    assert any(SM90 in n for n in names), names
    assert any("key_order_kernel" in n for n in names), names
    assert not [n for n in names if "sort" in n.lower() or "gather" in n], names
    full = keep.expand(b, nk).view(b, 1, 1, nk)
    ref, ref_lse = attention_ref(q, k, v, attn_mask=full, return_lse=True)
    dead = ~full.any(dim=-1)  # [B, 1, 1]: batch entries that keep no key
    assert not out.isnan().any()
    assert not out.masked_select(dead.unsqueeze(-1).expand_as(out)).any(), "rows without a key must be 0"
    mma.check_exact(metrics, out, ref, PVDtype.FP8)
    assert bool((lse.masked_select(dead.expand_as(lse)) == -math.inf).all())
    live = ~dead.expand_as(lse)
    mma.check_lse(lse[live], ref_lse[live], LSE_ATOL)
    # The kernel's own computation: sage_ref on the compacted K and V with the prefix mask of their lengths.
    kc, vc, kv_len = mma.compact_keys(k, v, mask)
    prefix = (torch.arange(nk, device="cuda") < kv_len.view(b, 1).long()).view(b, 1, 1, nk)
    if d % 8 == 0:
        options = {"pv": PVDtype.FP8, "block_m": 1, "block_n": 128, "rowsum": "rounded",
                   "half_exp2_tiles": cuda_sm90.half_exp2_tiles(d)}  # fmt: skip
        tight = sage_ref(q, kc, vc, attn_mask=prefix, **options)
        mma.check_tight(metrics, out, tight, PVDtype.FP8)


def test_key_rows_is_a_view():
    keep = torch.tensor([[True, False, True], [False] * 3], device="cuda")
    rows = cuda_sm90.key_rows(keep.view(2, 1, 1, 3), 2, 3)
    assert (
        rows.dtype == torch.uint8
        and rows.data_ptr() == keep.data_ptr()
        and rows.tolist() == [[1, 0, 1], [0] * 3]
    )
    broadcast = cuda_sm90.key_rows(keep[:1].view(1, 3), 2, 3)
    assert broadcast.stride() == (0, 1) and broadcast.shape == (2, 3)


@pytest.mark.parametrize(
    "make_mask, is_causal",
    [
        (lambda keep, nq: keep.view(2, 1, 1, -1), True),  # with is_causal: positions matter
        (lambda keep, nq: keep.view(2, 1, 1, -1).repeat(1, 1, nq, 1), False),  # a row per query
        (lambda keep, nq: torch.zeros(2, 1, 1, keep.shape[-1], device="cuda"), False),  # additive
    ],
    ids=["causal", "per-query", "additive"],
)
def test_other_masks_go_to_triton(mma, make_mask, is_causal):
    q, k, v = (mma.make(2, 4, 256, 128, "HND", torch.bfloat16, i) for i in range(3))
    mask = make_mask(_keep(2, 256, 0, "random"), 256)
    if mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
    kind = mask_kind(mask, is_causal)
    request = dispatch.make_request("cuda", torch.cuda.current_device(), q.dtype, 128, kind)
    assert dispatch.decide(request)[0].backend is dispatch.TRITON_FP8
    names = mma.kernels_on_gpu(lambda: sa.sageattn(q, k, v, attn_mask=mask, is_causal=is_causal))
    assert not any(SM90 in n for n in names), names
