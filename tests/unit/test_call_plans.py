"""Call plans (dispatch.call_plan): an eager sageattn call without options whose signature was served
before runs the plan its first call made, skipping the checks and the layers. On the CPU a stand-in
backend with a plan takes the calls; tests/gpu/test_call_plans.py checks the sm90 plan's bits."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import sageattention as sa
from sageattention import core, dispatch
from sageattention.reference import attention_ref


class _Recorder:
    """A backend whose dense path and plan both compute exact attention, counting which one ran."""

    def __init__(self):
        self.dense_calls, self.plan_calls, self.plans_made = 0, 0, []

    def dense(self, q, k, v, *, attn_mask, is_causal, sm_scale, return_lse, smooth_k, pv, options):
        self.dense_calls += 1
        out = attention_ref(q, k, v, is_causal=is_causal, sm_scale=sm_scale, attn_mask=attn_mask).to(q.dtype)
        return out, (torch.zeros(q.shape[:3]) if return_lse else None)

    def plan(self, q, k, v, *, nhd, is_causal, sm_scale, smooth_k, return_lse, key_mask):
        made = {"nhd": nhd, "is_causal": is_causal, "sm_scale": sm_scale, "return_lse": return_lse}
        if key_mask is not None:
            made["mask"] = (tuple(key_mask.shape), key_mask.stride())
        self.plans_made.append(made)

        def run(q, k, v, *mask):
            assert len(mask) == (key_mask is not None), "a masked plan takes the mask, an unmasked one none"
            self.plan_calls += 1
            layout = "NHD" if nhd else "HND"
            out = attention_ref(q, k, v, tensor_layout=layout, is_causal=is_causal, sm_scale=sm_scale,
                                attn_mask=mask[0] if mask else None)  # fmt: skip
            out = out.to(q.dtype)
            return out, (torch.zeros(out.shape[0], q.shape[2 if nhd else 1], q.shape[1 if nhd else 2])
                         if return_lse else None)  # fmt: skip

        return run


@pytest.fixture
def recorder(monkeypatch):
    rec = _Recorder()
    backend = dataclasses.replace(dispatch.SDPA, name="planned", dense=rec.dense, plan=rec.plan)
    monkeypatch.setitem(dispatch.BACKENDS, "planned", backend)
    monkeypatch.setattr(dispatch, "select", lambda *args: "planned")
    return rec


def _qkv(layout="HND", b=1, h=2, n=17, d=32, requires_grad=False):
    shape = (b, h, n, d) if layout == "HND" else (b, n, h, d)
    return [torch.randn(shape, dtype=torch.bfloat16, requires_grad=requires_grad) for _ in range(3)]


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_second_call_of_a_signature_runs_the_plan(recorder, layout):
    q, k, v = _qkv(layout)
    first = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=True)
    assert (recorder.dense_calls, recorder.plan_calls) == (1, 0)
    assert recorder.plans_made == [{"nhd": layout == "NHD", "is_causal": True, "sm_scale": 1 / 32**0.5,
                                    "return_lse": False}]  # fmt: skip
    q2, k2, v2 = (torch.randn_like(x) for x in (q, k, v))  # new data, same signature
    second = sa.sageattn(q2, k2, v2, tensor_layout=layout, is_causal=True)
    assert (recorder.dense_calls, recorder.plan_calls) == (1, 1)
    assert second.shape == first.shape and second.stride() == first.stride()
    ref = attention_ref(q2, k2, v2, tensor_layout=layout, is_causal=True).to(q.dtype)
    torch.testing.assert_close(second, ref)


def test_plan_returns_the_lse_when_asked(recorder):
    q, k, v = _qkv()
    sa.sageattn(q, k, v, return_lse=True)
    out, lse = sa.sageattn(q, k, v, return_lse=True)
    assert recorder.plan_calls == 1 and lse.shape == (1, 2, 17)


@pytest.mark.parametrize(
    "change",
    [
        lambda q, k, v: (q[:, :, :16], k, v),  # another query length
        lambda q, k, v: (q.transpose(1, 2).contiguous().transpose(1, 2), k, v),  # other strides
        lambda q, k, v: (q.half(), k.half(), v.half()),  # another dtype
    ],
    ids=["shape", "strides", "dtype"],
)
def test_another_signature_goes_the_whole_way(recorder, change):
    q, k, v = _qkv()
    sa.sageattn(q, k, v)
    sa.sageattn(*change(q, k, v))
    assert (recorder.dense_calls, recorder.plan_calls) == (2, 0)


@pytest.mark.parametrize(
    "call",
    [
        lambda q, k, v: sa.sageattn(q, k, v, is_causal=True),
        lambda q, k, v: sa.sageattn(q, k, v, sm_scale=0.5),
        lambda q, k, v: sa.sageattn(q, k, v, return_lse=True)[0],
        lambda q, k, v: sa.sageattn(*(x.transpose(1, 2) for x in (q, k, v)), tensor_layout="NHD"),
    ],
    ids=["is_causal", "sm_scale", "return_lse", "layout"],
)
def test_arguments_are_part_of_the_signature(recorder, call):
    q, k, v = _qkv()
    sa.sageattn(q, k, v)
    call(q, k, v)
    assert (recorder.dense_calls, recorder.plan_calls) == (2, 0)


def test_calls_with_options_never_use_a_plan(recorder):
    q, k, v = _qkv()
    for _ in range(2):
        sa.sageattn(q, k, v, smooth_k=False)
        sa.sageattn(q, k, v, causal=True)
    assert recorder.plan_calls == 0 and recorder.plans_made == []


def test_calls_that_need_a_gradient_never_use_a_plan(recorder, monkeypatch):
    seen = []
    monkeypatch.setattr(core.autograd, "dense", lambda *a, **kw: seen.append(1) or (a[1], None))
    q, k, v = _qkv()
    sa.sageattn(q, k, v)  # planned
    qg, kg, vg = _qkv(requires_grad=True)
    sa.sageattn(qg, kg, vg)
    assert seen == [1] and recorder.plan_calls == 0
    with torch.no_grad():  # the same tensors under no_grad need none: the plan runs
        sa.sageattn(qg, kg, vg)
    assert recorder.plan_calls == 1


def test_masked_calls_have_plans_of_their_own(recorder):
    """A call whose only option is attn_mask is planned by the mask's signature (shape, strides, dtype,
    device); the plan takes the mask of each call, whose values may change."""
    q, k, v = _qkv()
    keep = torch.rand(1, 1, 1, 17) < 0.7
    keep[..., 0] = True
    sa.sageattn(q, k, v, attn_mask=keep)
    assert recorder.plans_made == [{"nhd": False, "is_causal": False, "sm_scale": 1 / 32**0.5,
                                    "return_lse": False, "mask": ((1, 1, 1, 17), keep.stride())}]  # fmt: skip
    other = ~keep
    other[..., 0] = True
    out = sa.sageattn(q, k, v, attn_mask=other)  # the same signature, other values: the plan
    assert (recorder.dense_calls, recorder.plan_calls) == (1, 1)
    torch.testing.assert_close(out, attention_ref(q, k, v, attn_mask=other).to(q.dtype))
    sa.sageattn(q, k, v)  # no mask: a signature of its own
    sa.sageattn(q, k, v, attn_mask=keep.expand(1, 2, 17, 17))  # other strides: another one
    sa.sageattn(q, k, v, attn_mask=None)  # attn_mask=None is the unmasked signature, planned above
    assert (recorder.dense_calls, recorder.plan_calls) == (3, 2)


def test_a_mask_that_needs_a_gradient_never_uses_a_plan(recorder, monkeypatch):
    seen = []
    monkeypatch.setattr(core.autograd, "dense", lambda *a, **kw: seen.append(1) or (a[1], None))
    q, k, v = _qkv()
    bias = torch.zeros(1, 1, 1, 17)
    sa.sageattn(q, k, v, attn_mask=bias)  # planned
    sa.sageattn(q, k, v, attn_mask=bias.requires_grad_())
    assert seen == [1] and recorder.plan_calls == 0


def test_tensor_subclasses_go_the_whole_way(recorder):
    q, k, v = (torch.nn.Parameter(x, requires_grad=False) for x in _qkv())
    for _ in range(2):
        sa.sageattn(q, k, v)
    assert (recorder.dense_calls, recorder.plan_calls) == (2, 0) and recorder.plans_made == []


def test_a_backend_without_a_plan_is_asked_once(monkeypatch):
    made = []
    backend = dataclasses.replace(dispatch.SDPA, name="unplanned", plan=lambda *a, **kw: made.append(1))
    monkeypatch.setitem(dispatch.BACKENDS, "unplanned", backend)
    monkeypatch.setattr(dispatch, "select", lambda *args: "unplanned")
    q, k, v = _qkv()
    for _ in range(3):
        sa.sageattn(q, k, v)
    assert made == [1]  # its None is remembered as "no plan"


def test_reset_forgets_the_plans(recorder):
    q, k, v = _qkv()
    sa.sageattn(q, k, v)
    dispatch.reset()
    sa.sageattn(q, k, v)
    assert (recorder.dense_calls, recorder.plan_calls) == (2, 0)


def test_invalid_calls_are_never_planned(recorder):
    q, k, v = _qkv()
    for _ in range(2):
        with pytest.raises(ValueError, match="tensor_layout"):
            sa.sageattn(q, k, v, tensor_layout="BHND")
        with pytest.raises(TypeError, match="is_causal must be a bool"):
            sa.sageattn(q, k, v, is_causal="yes")
    assert recorder.plans_made == []


def test_the_sdpa_fallback_makes_no_plan():
    """On the CPU sageattn runs torch SDPA, which has no plan: every call goes the whole way."""
    q, k, v = _qkv()
    with pytest.warns(dispatch.SageAttentionFallbackWarning):
        first = sa.sageattn(q, k, v)
    second = sa.sageattn(q, k, v)
    assert torch.equal(first, second) and set(dispatch._plans.values()) == {False}
