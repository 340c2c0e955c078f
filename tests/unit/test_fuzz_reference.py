"""Property-based tests (hypothesis) over shapes, layouts, dtypes, GQA ratios, causal, lengths and masks,
on the CPU: the references, the public API's SDPA fallback, and the argument checks.

Budget: a fixed number of examples per property (``settings`` below), drawn the same way on every
run (``derandomize=True``), so CI sees the same cases every time and a failure reproduces; the whole
file takes about 10 s on 2 cores (4 s within the full unit run, where torch is loaded already).
tests/gpu/test_fuzz_gpu.py runs the same kind of properties on CUDA for the quantized kernels, with a
larger budget.

Properties and their bounds:

* ``attention_ref`` equals torch SDPA in float64 (GQA by repeated KV heads, causal and masks combined
  into one SDPA mask), to 1e-10, and its LSE equals ``logsumexp`` of the masked scores.
* ``sage_ref`` (FP16 and FP8 P·V, one- and two-level K, smooth-K on and off, Q blocks of 1, 64, 128
  rows, K blocks of 64 and 128 keys) against ``attention_ref`` on randn inputs (``FUZZ_BOUNDS``):
  every element within ``max_abs`` times max|v| (attention averages rows of V, so its error is one of
  V's scale); for outputs of 4096 elements or more with at least 16 queries and keys, cosine and
  relative L1 as well; the LSE within 0.1 (natural log). Measured over 600 random cases drawn like
  these (a plain random sweep): max error 0.012 (FP16) / 0.033 (FP8) of max|v|; cosine 0.99992 /
  0.99929 and relative L1 0.013 / 0.038 on the large outputs; LSE 0.048 (Q blocks of 64 rows). The
  bounds leave a margin over those.
* ``sage_ref`` never gives NaN or Inf, also for all-zero, constant, huge and tiny inputs and rows that
  a mask leaves without a key (those give 0, with an LSE of -inf).
* ``sageattn`` on the CPU warns once that it falls back to SDPA, and agrees with ``attention_ref``;
  it returns q's dtype and shape, contiguous in the caller's layout, and the LSE when asked.
* A bad argument (wrong ndim, int or float32 tensors, mixed dtypes, heads that do not divide, a bad
  layout string, a strided last dim, bad masks, scales, flags, options) to any dense
  entry point raises TypeError or ValueError whose message names the argument, never anything else.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sageattention as sa
from sageattention import core, dispatch
from sageattention.quant import PVDtype
from sageattention.reference import attention_ref, sage_ref

FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

#: sage_ref against attention_ref on randn inputs: max |out - ref| / max |v| for every case; (min
#: cosine, max relative L1) for outputs of LARGE elements or more (and 16 queries and keys).
FUZZ_BOUNDS = {
    PVDtype.FP16: {"max_abs": 0.03, "cos": 0.9998, "rel_l1": 0.02},
    PVDtype.FP8: {"max_abs": 0.08, "cos": 0.998, "rel_l1": 0.05},
}
LARGE = 4096
LSE_BOUND = 0.1  # natural log, on rows with a visible key
HEAD_DIMS = st.one_of(st.sampled_from([1, 8, 64, 72, 128]), st.integers(1, 128))
DTYPES = st.sampled_from([torch.float16, torch.bfloat16])
MASK_SHAPES = ("qk", "k", "q", "b1qk", "1hqk", "bhqk")


@dataclass
class Case:
    """One drawn problem; ``tensors()`` makes its inputs (the same ones for the same seed)."""

    b: int
    hq: int
    hkv: int
    nq: int
    nk: int
    d: int
    layout: str
    dtype: torch.dtype
    causal: bool
    mask: str | None  # None, "bool" or "additive"
    mask_shape: str
    seed: int
    scale: float = 1.0

    def mask_dims(self) -> tuple[int, ...]:
        b, h, q, k = self.b, self.hq, self.nq, self.nk
        return {"qk": (q, k), "k": (1, k), "q": (q, 1), "b1qk": (b, 1, q, k), "1hqk": (1, h, q, k),
                "bhqk": (b, h, q, k)}[self.mask_shape]  # fmt: skip

    def tensors(self, kind: str = "randn", device: str = "cpu"):
        gen = torch.Generator().manual_seed(self.seed)

        def make(heads, n):
            x = torch.randn(self.b, heads, n, self.d, generator=gen) * self.scale
            if kind == "zeros":
                x = torch.zeros_like(x)
            elif kind == "constant":
                x = torch.full_like(x, 0.75)
            x = x.to(device=device, dtype=self.dtype)
            return x.transpose(1, 2).contiguous() if self.layout == "NHD" else x

        q, k, v = make(self.hq, self.nq), make(self.hkv, self.nk), make(self.hkv, self.nk)
        attn_mask = None
        if self.mask == "bool":
            keep = torch.rand((), generator=gen).item() * 0.6  # some rows may end up with no key at all
            attn_mask = (torch.rand(self.mask_dims(), generator=gen) > keep).to(device)
        elif self.mask == "additive":
            attn_mask = (2 * torch.randn(self.mask_dims(), generator=gen)).to(device)
        return q, k, v, attn_mask


@st.composite
def cases(draw, max_len: int = 200, masks: bool = True, scales=(1.0,)) -> Case:
    kv_heads = draw(st.integers(1, 3))
    groups = draw(st.sampled_from([1, 2, 3, 4]))  # the GQA ratio: q heads = kv heads x groups
    return Case(
        b=draw(st.integers(1, 2)),
        hq=kv_heads * groups,
        hkv=kv_heads,
        nq=draw(st.integers(1, max_len)),
        nk=draw(st.integers(1, max_len)),
        d=draw(HEAD_DIMS),
        layout=draw(st.sampled_from(["HND", "NHD"])),
        dtype=draw(DTYPES),
        causal=draw(st.booleans()),
        mask=draw(st.sampled_from([None, "bool", "additive"])) if masks else None,
        mask_shape=draw(st.sampled_from(MASK_SHAPES)),
        seed=draw(st.integers(0, 2**31 - 1)),
        scale=draw(st.sampled_from(scales)),
    )


def _stats(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    o, r = out.double().flatten(), ref.double().flatten()
    denom = o.norm() * r.norm()
    cos = float(o @ r / denom) if denom > 0 else 1.0
    return cos, float((o - r).abs().sum() / r.abs().sum().clamp_min(1e-30))


def _hnd(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x.transpose(1, 2) if layout == "NHD" else x


# --------------------------------------------------------------------------------------------------
# attention_ref == torch SDPA (float64)


def _sdpa64(case: Case, q, k, v, attn_mask, sm_scale):
    """torch SDPA in float64, HND, KV heads repeated for GQA; causal and the mask as one SDPA mask."""
    q, k, v = (_hnd(x, case.layout).double() for x in (q, k, v))
    k, v = k.repeat_interleave(case.hq // case.hkv, dim=1), v.repeat_interleave(case.hq // case.hkv, dim=1)
    kw = {"scale": sm_scale}
    if attn_mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, **kw)
    mask = attn_mask if attn_mask.dtype == torch.bool else attn_mask.double()
    if case.causal:
        below = torch.ones(case.nq, case.nk, dtype=torch.bool).tril()
        mask = mask & below if mask.dtype == torch.bool else mask.masked_fill(~below, -math.inf)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)


@settings(FUZZ, max_examples=200)
@given(case=cases(), sm_scale=st.one_of(st.none(), st.floats(0.01, 2.0)))
def test_attention_ref_equals_sdpa_in_float64(case, sm_scale):
    q, k, v, attn_mask = case.tensors()
    out, lse = attention_ref(q, k, v, tensor_layout=case.layout, is_causal=case.causal, sm_scale=sm_scale,
                             attn_mask=attn_mask, return_lse=True)  # fmt: skip
    expect = _hnd(_sdpa64(case, q, k, v, attn_mask, sm_scale or 1 / math.sqrt(case.d)), case.layout)
    assert out.dtype == torch.float64 and out.shape == q.shape
    torch.testing.assert_close(out, expect, rtol=1e-10, atol=1e-10)
    # LSE: logsumexp of the masked, scaled scores
    qh, kh = _hnd(q, case.layout).double(), _hnd(k, case.layout).double()
    s = qh @ kh.repeat_interleave(case.hq // case.hkv, dim=1).transpose(-1, -2) * (sm_scale or case.d**-0.5)
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        s = s + attn_mask.double()
    visible = torch.ones(case.nq, case.nk, dtype=torch.bool)
    if case.causal:
        visible = visible.tril()
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        visible = visible & attn_mask
    torch.testing.assert_close(lse, torch.logsumexp(s.masked_fill(~visible, -math.inf), dim=-1))


# --------------------------------------------------------------------------------------------------
# sage_ref: within bounds of attention_ref, never NaN


@settings(FUZZ, max_examples=300)
@given(
    case=cases(),
    pv=st.sampled_from([PVDtype.FP16, PVDtype.FP8]),
    k_residual=st.booleans(),
    smooth_k=st.booleans(),
    block_m=st.sampled_from([1, 64, 128]),
    block_n=st.sampled_from([64, 128]),
)
def test_sage_ref_within_bounds_of_attention_ref(case, pv, k_residual, smooth_k, block_m, block_n):
    q, k, v, attn_mask = case.tensors()
    kw = {"tensor_layout": case.layout, "is_causal": case.causal, "attn_mask": attn_mask, "return_lse": True}
    out, lse = sage_ref(q, k, v, pv=pv, k_residual=k_residual, smooth_k=smooth_k, block_m=block_m,
                        block_n=block_n, **kw)  # fmt: skip
    ref, ref_lse = attention_ref(q, k, v, **kw)
    assert out.shape == q.shape and lse.shape == (case.b, case.hq, case.nq)
    assert torch.isfinite(out).all(), "NaN or Inf in sage_ref's output"
    bounds = FUZZ_BOUNDS[pv]
    err = float((out.double() - ref).abs().max() / v.double().abs().max().clamp_min(1e-30))
    assert err <= bounds["max_abs"], f"max |out - ref| = {err:.4g} x max|v|"
    if out.numel() >= LARGE and min(case.nq, case.nk) >= 16:
        cos, l1 = _stats(out, ref)
        assert cos >= bounds["cos"] and l1 <= bounds["rel_l1"], f"cos {cos:.6f}, relative L1 {l1:.4g}"
    alive = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), alive), "rows without a visible key must give an LSE of -inf"
    assert torch.all(out.double()[_hnd_rows_dead(~alive, case.layout)] == 0)
    lse_err = float((lse.double()[alive] - ref_lse[alive]).abs().max()) if alive.any() else 0.0
    assert lse_err <= LSE_BOUND, f"LSE error {lse_err:.4g}"


def _hnd_rows_dead(dead: torch.Tensor, layout: str) -> torch.Tensor:
    """[B, H, N] dead rows as an index of the caller's layout's output ([B, N, H, D] for NHD)."""
    return dead.transpose(1, 2) if layout == "NHD" else dead


@settings(FUZZ, max_examples=100)
@given(
    case=cases(max_len=96, scales=(1e-4, 1.0, 30.0)),
    kind=st.sampled_from(["randn", "zeros", "constant"]),
    pv=st.sampled_from([PVDtype.FP16, PVDtype.FP8]),
    k_residual=st.booleans(),
    smooth_k=st.booleans(),
)
def test_sage_ref_never_gives_nan(case, kind, pv, k_residual, smooth_k):
    """All-zero, constant, huge (scores in the thousands) and tiny inputs; dead rows under masks."""
    q, k, v, attn_mask = case.tensors(kind)
    out, lse = sage_ref(q, k, v, tensor_layout=case.layout, is_causal=case.causal, attn_mask=attn_mask,
                        pv=pv, k_residual=k_residual, smooth_k=smooth_k, return_lse=True)  # fmt: skip
    assert torch.isfinite(out).all(), "NaN or Inf in the output"
    assert not torch.isnan(lse).any() and not (lse == math.inf).any(), "NaN or +Inf in the LSE"


# --------------------------------------------------------------------------------------------------
# The public API on the CPU: the SDPA fallback


@settings(FUZZ, max_examples=200)
@given(
    case=cases(),
    sm_scale=st.one_of(st.none(), st.floats(0.02, 1.0)),
    return_lse=st.booleans(),
    strided=st.booleans(),
)
def test_public_api_on_cpu_falls_back_and_agrees(case, sm_scale, return_lse, strided):
    q, k, v, attn_mask = case.tensors()
    if strided:  # views into wider tensors: strided rows, a unit last stride (packed projections)
        q, k, v = (torch.cat([x, torch.zeros_like(x)], dim=-1)[..., : case.d] for x in (q, k, v))
    dispatch.reset()  # forget earlier examples' decision and warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = sa.sageattn(q, k, v, tensor_layout=case.layout, is_causal=case.causal, sm_scale=sm_scale,
                             return_lse=return_lse, attn_mask=attn_mask)  # fmt: skip
    said = [str(w.message) for w in caught if issubclass(w.category, sa.SageAttentionFallbackWarning)]
    assert len(said) == 1 and "device cpu is not a CUDA GPU" in said[0], said
    out, lse = result if return_lse else (result, None)
    assert out.dtype == q.dtype and out.shape == q.shape and out.device == q.device
    assert out.is_contiguous(), f"the output is not contiguous in the caller's {case.layout} layout"
    ref, ref_lse = attention_ref(q, k, v, tensor_layout=case.layout, is_causal=case.causal, sm_scale=sm_scale,
                                 attn_mask=attn_mask, return_lse=True)  # fmt: skip
    assert torch.isfinite(out).all()
    tol = 1e-2 if case.dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    if return_lse:
        assert lse.dtype == torch.float32 and lse.shape == (case.b, case.hq, case.nq)
        alive = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), alive)
        torch.testing.assert_close(lse.double()[alive], ref_lse[alive], rtol=0, atol=1e-4)


# --------------------------------------------------------------------------------------------------
# Argument checks: random invalid inputs raise TypeError/ValueError naming the argument

ENTRY_POINTS = [fn for fn in core.PUBLIC_FUNCTIONS if fn is not sa.sageattn_varlen]  # the dense ones
QKV = ("q", "k", "v")
NOT_TENSORS = st.sampled_from([None, 1.0, 3, "q", [[1.0, 2.0]], (1, 2)])
BAD_LAYOUTS = st.one_of(
    st.sampled_from(["hnd", "nhd", "BHND", "BNHD", "", " HND", "HND ", "NDH"]),
    st.text(max_size=6).filter(lambda s: s not in ("HND", "NHD")),
    st.sampled_from([None, 0, 1.5]),
)


@st.composite
def bad_calls(draw):
    """(kwargs of a dense call, TypeError or ValueError, pattern the message must match)."""
    b, hkv = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    hq, nq, nk, d = hkv * draw(st.integers(1, 3)), draw(st.integers(1, 20)), draw(st.integers(1, 20)), 16
    layout = draw(st.sampled_from(["HND", "NHD"]))
    dtype = draw(DTYPES)
    shapes = {"q": [b, hq, nq, d], "k": [b, hkv, nk, d], "v": [b, hkv, nk, d]}
    dtypes = dict.fromkeys(QKV, dtype)
    call: dict = {"tensor_layout": layout}
    name = draw(st.sampled_from(QKV))
    fault = draw(st.sampled_from([
        "ndim", "int_dtype", "float_dtype", "mixed_dtypes", "not_tensor", "heads", "head_dim_zero",
        "layout", "strided_last_dim", "batch", "head_dim", "kv_shape", "mask_dtype", "mask_shape",
        "mask_not_tensor", "sm_scale_value", "sm_scale_type", "flag", "unknown_kwarg", "option",
    ]))  # fmt: skip
    exc, pattern = ValueError, None
    strided = None
    if fault == "ndim":
        shapes[name] = draw(st.sampled_from([shapes[name][1:], [1, *shapes[name]], shapes[name][:2]]))
        pattern = rf"^{name} must have 4 dimensions"
    elif fault == "int_dtype":
        dtypes[name] = draw(st.sampled_from([torch.int8, torch.int32, torch.int64, torch.uint8, torch.bool]))
        exc, pattern = TypeError, rf"^{name} has dtype {dtypes[name]}"
    elif fault == "float_dtype":
        dtypes[name] = draw(st.sampled_from([torch.float32, torch.float64]))
        exc, pattern = TypeError, rf"^{name} has dtype {dtypes[name]}.*{name}\.half\(\)"
    elif fault == "mixed_dtypes":
        dtypes[name] = torch.bfloat16 if dtype == torch.float16 else torch.float16
        exc, pattern = TypeError, r"^q, k and v must have the same dtype"
    elif fault == "not_tensor":
        shapes[name] = draw(NOT_TENSORS)
        exc, pattern = TypeError, rf"^{name} must be a torch\.Tensor"
    elif fault == "heads":
        shapes["k"][1] = shapes["v"][1] = hq + 1  # never divides hq
        pattern = rf"number of q heads \({hq}\) must be a multiple of the number of k/v heads \({hq + 1}\)"
    elif fault == "head_dim_zero":
        for x in QKV:
            shapes[x][3] = 0
        pattern = r"head_dim \(the last dimension of q\) must be at least 1"
    elif fault == "layout":
        call["tensor_layout"] = draw(BAD_LAYOUTS)
        pattern = r"^tensor_layout=.* is not supported; valid values: 'HND', 'NHD'"
    elif fault == "strided_last_dim":
        strided = name
        pattern = rf"^{name} must have a contiguous last dimension.*{name}\.contiguous\(\)"
    elif fault == "batch":
        shapes[name][0] = b + 1
        if name != "q":  # k and v must agree with each other, or that is reported first
            shapes["k"][0] = shapes["v"][0] = b + 1
        pattern = r"q, k and v must have the same batch size"
    elif fault == "head_dim":
        shapes["k"][3] = shapes["v"][3] = d * 2
        pattern = r"q, k and v must have the same head_dim"
    elif fault == "kv_shape":
        shapes[draw(st.sampled_from(["k", "v"]))][draw(st.sampled_from([2, 3]))] += 1
        pattern = r"k and v must have the same shape"
    elif fault == "mask_dtype":
        call["attn_mask"] = torch.ones(
            nq, nk, dtype=draw(st.sampled_from([torch.int32, torch.int64, torch.uint8]))
        )
        exc, pattern = TypeError, r"^attn_mask has dtype"
    elif fault == "mask_shape":
        call["attn_mask"] = torch.ones(
            *draw(
                st.sampled_from(
                    [
                        (nq, nk + 1),
                        (nq + 1, nk),
                        (nk,),
                        (1, 1, 1, nq, nk),
                        (1, hq + 1, nq, nk),
                        (b + 1, 1, nq, nk),
                    ]
                )
            ),
            dtype=torch.bool,
        )
        pattern = r"^attn_mask of shape .* is not broadcastable"
    elif fault == "mask_not_tensor":
        call["attn_mask"] = draw(st.sampled_from([[[True]], 1.0, "causal"]))
        exc, pattern = TypeError, r"^attn_mask must be a torch\.Tensor or None"
    elif fault == "sm_scale_value":
        call["sm_scale"] = draw(st.sampled_from([0.0, -0.5, -1e-9, math.inf, -math.inf, math.nan]))
        pattern = r"^sm_scale must be a positive finite number"
    elif fault == "sm_scale_type":
        call["sm_scale"] = draw(st.sampled_from(["0.1", True, torch.tensor(0.1), [0.1]]))
        exc, pattern = TypeError, r"^sm_scale must be a Python float"
    elif fault == "flag":
        flag = draw(st.sampled_from(["is_causal", "return_lse", "smooth_k"]))
        call[flag] = draw(st.sampled_from(["yes", None, 1.0, torch.tensor(True), [True]]))
        exc, pattern = TypeError, rf"^{flag} must be a bool"
    elif fault == "unknown_kwarg":
        key = draw(st.sampled_from(["dropout_p", "scale", "atn_mask", "enable_gqa"]))
        call[key] = None
        exc, pattern = TypeError, rf"got unexpected keyword argument\(s\) '{key}'"
    elif fault == "option":
        option = draw(st.sampled_from(["qk_quant_gran", "pv_accum_dtype", "quantization_backend"]))
        call[option] = draw(st.sampled_from(["per_tensor", "fp64", "numpy", "", "FP32"]))
        pattern = rf"^{option}=.* is not supported"

    def tensor(x):
        shape = shapes[x]
        if not isinstance(shape, list):
            return shape  # not a tensor at all
        t = torch.randn(shape)  # [B, H, N, D] when 4-d; NHD callers get [B, N, H, D] memory
        if layout == "NHD" and t.dim() == 4:
            t = t.transpose(1, 2).contiguous()
        t = t > 0 if dtypes[x] == torch.bool else t.to(dtypes[x])
        return torch.cat([t, t], dim=-1)[..., ::2] if x == strided else t

    call.update({x: tensor(x) for x in QKV})
    return call, exc, pattern


@settings(FUZZ, max_examples=500)
@given(bad=bad_calls(), entry=st.sampled_from(ENTRY_POINTS))
def test_bad_arguments_raise_type_or_value_error_naming_the_argument(bad, entry):
    call, exc, pattern = bad
    q, k, v = call.pop("q"), call.pop("k"), call.pop("v")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a call that wrongly passes the checks falls back with a warning
        try:
            entry(q, k, v, **call)
        except (TypeError, ValueError) as error:
            message = str(error)
            assert isinstance(error, exc), f"{type(error).__name__} instead of {exc.__name__}: {message}"
            assert re.search(pattern, message), f"{message!r} does not match {pattern!r}"
        except Exception as error:  # noqa: BLE001 - the property: nothing but TypeError/ValueError
            pytest.fail(f"{entry.__name__} raised {type(error).__name__} for a bad argument: {error}")
        else:
            pytest.fail(f"{entry.__name__} accepted a bad argument (expected {exc.__name__}: {pattern})")
