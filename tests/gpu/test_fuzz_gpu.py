"""Property-based tests (hypothesis) of the quantized kernels on a GPU, over shapes, layouts, dtypes, GQA
ratios, causal, lengths, masks, scales and strided inputs: the GPU side of tests/unit/test_fuzz_reference.py.

Backends: every quantized entry point that can run on this GPU (conftest's ``sage_backend``):
``sageattn`` (whatever dispatch picks here), the Triton kernels (FP16 P·V from sm80, FP8 P·V from
sm89) and the compiled kernels (sm80 ``sageattn_qk_int8_pv_fp16_cuda``, sm89
``sageattn_qk_int8_pv_fp8_cuda`` and sm_90a ``sageattn_qk_int8_pv_fp8_cuda_sm90``, where built; the
mma.sync ones also run on newer GPUs), each held to ``sage_ref`` with the options that reproduce its
quantization (``SageBackend.reference_options``: the kernels' own block sizes and K digits).
Properties, for each backend:

* the output has q's dtype and shape (and q's strides over the dimensions longer than 1 when q is
  dense), holds no NaN or Inf, and is within conftest's TIGHT_BOUNDS of ``sage_ref`` (cosine, and
  max|out - ref| / max|ref|; the reasons for the bounds are given there); the LSE within 1e-2 of
  ``sage_ref``'s, -inf exactly on rows a mask leaves without a key, whose output is 0;
* two calls on the same inputs give the same bits (output and LSE);
* a bad argument with CUDA tensors raises TypeError or ValueError naming it, before any kernel runs.

Budget: ``SAGEATTN_FUZZ_EXAMPLES`` examples per property and backend (default 60). Inputs are fresh on
every run (hypothesis' own random seed); a failure prints the failing example and a
``@reproduce_failure`` blob, and ``pytest --hypothesis-seed=N`` repeats a run. On an H100 (torch 2.11,
triton 3.6) the default budget takes 2 to 3.5 minutes per Triton backend, most of it Triton compiling a
kernel for each new combination of head-dim tile, causal, mask kind and dtype (sageattn reuses the
kernels of the backend it dispatches to; the compiled backends compile nothing).
"""

from __future__ import annotations

import math
import os
import re
import warnings
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sageattention._checks import KEY_PADDING_MASK, mask_kind
from sageattention.reference import sage_ref

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
# head dims that are not a multiple of 8 run through the Triton kernels on every backend
pytest.importorskip("sageattention.triton.launch")

EXAMPLES = int(os.environ.get("SAGEATTN_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
HEAD_DIMS = st.one_of(st.sampled_from([64, 128]), st.integers(1, 128))
DTYPES = st.sampled_from([torch.float16, torch.bfloat16])
#: The LSE against sage_ref's: one INT8 rounding flip (the K mean differs in its last bit) moves a short
#: row by about 2e-3 (tests/gpu/test_triton_api.py).
LSE_ATOL = 1e-2
#: The same where the kernel's row sum adds the rounded P (sm90, rowsum="rounded"): an element whose
#: 448 P sits next to an e4m3 rounding boundary can round the other way in the kernel (its exp2 is
#: ex2.approx), which moves the sum by one e4m3 step, at most 1/8 of that element, itself at most the
#: row's largest (448): the LSE by up to ln(1 + 1/16). Seen: 0.0112 (b=1 h=1 nq=253 nk=257 d=64,
#: sm_scale 0.25, H100).
LSE_ATOL_ROUNDED = math.log1p(1 / 16)


# --------------------------------------------------------------------------------------------------
# Problems


@dataclass
class Case:
    b: int
    hq: int
    hkv: int
    nq: int
    nk: int
    d: int
    layout: str
    dtype: torch.dtype
    causal: bool
    mask: str | None
    mask_shape: tuple[int, ...]
    strided: bool
    seed: int

    def tensors(self):
        gen = torch.Generator(device="cuda").manual_seed(self.seed)

        def make(heads, n):
            shape = (self.b, heads, n, self.d) if self.layout == "HND" else (self.b, n, heads, self.d)
            if self.strided:  # a view into a wider tensor: strided rows, unit last stride
                wide = torch.randn(*shape[:-1], self.d + 8, device="cuda", generator=gen)
                return wide.to(self.dtype)[..., : self.d]
            return torch.randn(shape, device="cuda", generator=gen).to(self.dtype)

        q, k, v = make(self.hq, self.nq), make(self.hkv, self.nk), make(self.hkv, self.nk)
        attn_mask = None
        if self.mask == "bool":
            keep = float(torch.rand((), device="cuda", generator=gen)) * 0.6
            attn_mask = torch.rand(self.mask_shape, device="cuda", generator=gen) > keep
        elif self.mask == "additive":
            attn_mask = 2 * torch.randn(self.mask_shape, device="cuda", generator=gen)
        return q, k, v, attn_mask


def _hnd(x, layout):
    return x.transpose(1, 2) if layout == "NHD" else x


@st.composite
def cases(draw, masks: bool) -> Case:
    kv_heads = draw(st.integers(1, 4))
    hq = kv_heads * draw(st.sampled_from([1, 2, 4, 8]))
    b = draw(st.integers(1, 2))
    # long sequences with few heads: the reference's cost grows with b * hq * nq * nk
    long = st.integers(300, 2048) if b * hq <= 8 else st.integers(300, 768)
    length = st.one_of(st.integers(1, 300), long)
    nq, nk = draw(length), draw(length)
    mask = draw(st.sampled_from([None, "bool", "additive"])) if masks else None
    mask_shape = draw(st.sampled_from([(nq, nk), (1, nk), (nq, 1), (b, 1, nq, nk), (1, hq, nq, nk)]))
    return Case(
        b=b, hq=hq, hkv=kv_heads, nq=nq, nk=nk, d=draw(HEAD_DIMS),
        layout=draw(st.sampled_from(["HND", "NHD"])), dtype=draw(DTYPES),
        causal=draw(st.booleans()), mask=mask, mask_shape=mask_shape, strided=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------
# The kernels against sage_ref, and twice the same bits


@FUZZ
@given(data=st.data())
def test_kernel_matches_sage_ref_and_repeats_bit_for_bit(sage_backend, metrics, mma, data):
    backend = sage_backend
    case = data.draw(cases(masks=backend.masks))
    sm_scale = data.draw(st.one_of(st.none(), st.floats(0.02, 0.5)))
    smooth_k = data.draw(st.booleans())
    q, k, v, attn_mask = case.tensors()
    kw = {"tensor_layout": case.layout, "is_causal": case.causal, "sm_scale": sm_scale, "return_lse": True}
    if attn_mask is not None:
        kw["attn_mask"] = attn_mask
    out, lse = backend.call(q, k, v, smooth_k=smooth_k, **kw)
    again, lse_again = backend.call(q, k, v, smooth_k=smooth_k, **kw)
    torch.cuda.synchronize()

    assert out.dtype == q.dtype and out.shape == q.shape, (out.dtype, out.shape)
    assert out.stride()[-1] == 1
    if not case.strided:  # the stride of a dimension of length 1 says nothing about the layout
        strides = [(a, b) for a, b, n in zip(out.stride(), q.stride(), q.shape) if n > 1]
        assert all(a == b for a, b in strides), "the output is not stored in the caller's layout"
    assert lse.dtype == torch.float32 and lse.shape == (case.b, case.hq, case.nq)
    metrics.assert_finite(out)
    assert torch.equal(out, again), "two calls on the same inputs gave different outputs"
    assert torch.equal(lse, lse_again), "two calls on the same inputs gave different LSEs"

    has_mask = mask_kind(attn_mask, case.causal)
    shape = (case.b, case.hq, case.nq, case.nk)
    options = backend.reference_options(case.d, has_mask, shape=shape, causal=case.causal)
    ref_k, ref_v = k, v
    if has_mask == KEY_PADDING_MASK and backend.resolve(has_mask).name == "cuda_sm90" and case.d % 8 == 0:
        # The kernel attends to each batch entry's kept keys, moved to the front; it splits no tile.
        options.pop("key_parts", None)
        kc, vc, kv_len = mma.compact_keys(_hnd(k, case.layout), _hnd(v, case.layout), attn_mask)
        ref_k, ref_v = _hnd(kc, case.layout), _hnd(vc, case.layout)
        kw = {
            **kw,
            "attn_mask": (torch.arange(case.nk, device="cuda") < kv_len.view(-1, 1)).view(-1, 1, 1, case.nk),
        }
    ref, ref_lse = sage_ref(q, ref_k, ref_v, smooth_k=smooth_k, **options, **kw)
    pv = backend.resolve(has_mask).pv
    metrics.assert_tight(out, ref, pv, f"{backend.name} vs sage_ref, {case}")
    alive = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), alive), "rows without a visible key must give an LSE of -inf"
    assert not torch.isnan(lse).any()
    dead = _hnd(out, case.layout)[~alive]
    assert torch.all(dead == 0), "a row without a visible key must give 0"
    if alive.any():
        if backend.resolve(has_mask).rowsum == "rounded":  # flips: rare, each within LSE_ATOL_ROUNDED
            err = (lse[alive] - ref_lse[alive]).abs() - 1e-4 * ref_lse[alive].abs()
            assert err.max().item() <= LSE_ATOL_ROUNDED, f"LSE {err.max().item()} off sage_ref's"
            beyond = int((err > LSE_ATOL).sum())
            assert beyond <= max(1, err.numel() // 100), f"{beyond} of {err.numel()} LSEs beyond {LSE_ATOL}"
        else:
            torch.testing.assert_close(lse[alive], ref_lse[alive], atol=LSE_ATOL, rtol=1e-4)


# --------------------------------------------------------------------------------------------------
# Argument checks with CUDA tensors


@st.composite
def bad_cuda_calls(draw):
    """(q, k, v, keyword arguments, exception type, pattern of its message) with one fault."""
    b, hkv = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    hq, nq, nk, d = hkv * draw(st.integers(1, 3)), draw(st.integers(1, 64)), draw(st.integers(1, 64)), 64
    dtype = draw(st.sampled_from([torch.float16, torch.bfloat16]))

    def t(*shape, dt=dtype, device="cuda"):
        return torch.randn(shape, device=device).to(dt)

    q, k, v = t(b, hq, nq, d), t(b, hkv, nk, d), t(b, hkv, nk, d)
    name = draw(st.sampled_from(["q", "k", "v"]))
    tensors = {"q": q, "k": k, "v": v}
    kw: dict = {}
    fault = draw(st.sampled_from(["device", "dtype", "mixed", "ndim", "strided", "heads", "layout",
                                  "mask_device", "sm_scale"]))  # fmt: skip
    exc = ValueError
    if fault == "device":
        tensors[name] = tensors[name].cpu()
        pattern = r"q, k and v must be on the same device"
    elif fault == "dtype":
        tensors[name] = tensors[name].float()
        exc, pattern = TypeError, rf"^{name} has dtype torch.float32"
    elif fault == "mixed":
        tensors[name] = tensors[name].to(torch.bfloat16 if dtype == torch.float16 else torch.float16)
        exc, pattern = TypeError, r"^q, k and v must have the same dtype"
    elif fault == "ndim":
        tensors[name] = tensors[name][0]
        pattern = rf"^{name} must have 4 dimensions"
    elif fault == "strided":
        tensors[name] = torch.cat([tensors[name]] * 2, dim=-1)[..., ::2]
        pattern = rf"^{name} must have a contiguous last dimension"
    elif fault == "heads":
        tensors["k"], tensors["v"] = t(b, hq + 1, nk, d), t(b, hq + 1, nk, d)
        pattern = r"must be a multiple of the number of k/v heads"
    elif fault == "layout":
        kw["tensor_layout"] = draw(st.sampled_from(["hnd", "BHND", "", "NDH"]))
        pattern = r"^tensor_layout="
    elif fault == "mask_device":
        kw["attn_mask"] = torch.ones(nq, nk, dtype=torch.bool)
        pattern = r"^attn_mask must be on the same device as q"
    else:
        kw["sm_scale"] = draw(st.sampled_from([0.0, -1.0, math.nan, math.inf]))
        pattern = r"^sm_scale must be a positive finite number"
    return tensors["q"], tensors["k"], tensors["v"], kw, exc, pattern


@FUZZ
@given(bad=bad_cuda_calls())
def test_bad_arguments_with_cuda_tensors(sage_backend, bad):
    backend = sage_backend
    q, k, v, kw, exc, pattern = bad
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises((TypeError, ValueError)) as info:
            backend.call(q, k, v, **kw)
    assert isinstance(info.value, exc), f"{type(info.value).__name__}: {info.value}"
    assert re.search(pattern, str(info.value)), f"{str(info.value)!r} does not match {pattern!r}"
