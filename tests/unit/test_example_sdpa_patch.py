"""sageattention.integrations.sdpa on the CPU (and the script example/sdpa_monkeypatch.py): which calls
go to sageattn, and that every other call reaches the original scaled_dot_product_attention with its
arguments untouched (nothing dropped). The routing follows the library's own checks and dispatch table:
where those change (a backend that takes a new case), the patch follows.

sageattn's quantized path runs here through the ``triton_standin`` fixture (the simulated
quantization of sageattention.reference on CPU tensors), with the patch allowed to take CPU tensors.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from example import sdpa_monkeypatch as script
from example.measure import cosine
from sageattention import dispatch
from sageattention.integrations import sdpa as smp

SDPA = F.scaled_dot_product_attention


@pytest.fixture(autouse=True)
def _clean():
    smp.reset()
    yield
    smp.uninstall()
    smp.reset()
    assert F.scaled_dot_product_attention is SDPA


class Recorder:
    """Stands in for the original function: records each call, returns SDPA's result."""

    def __init__(self):
        self.calls = []

    def __call__(self, query, key, value, **kwargs):
        self.calls.append(((query, key, value), kwargs))
        return SDPA(query, key, value, **kwargs)


def qkv(b=1, hq=2, hkv=None, n=16, d=32, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hkv = hq if hkv is None else hkv
    shapes = ((b, hq, n, d), (b, hkv, n, d), (b, hkv, n, d))
    return tuple(torch.randn(*s, generator=gen).to(dtype) for s in shapes)


def _subclass(x):
    class Wrapped(torch.Tensor):
        pass

    return x.as_subclass(Wrapped)


def _unsupported_cases():
    q, k, v = qkv()
    mask = torch.ones(16, 16, dtype=torch.bool)
    return {
        "dropout": ((q, k, v), {"dropout_p": 0.1}, "dropout_p"),
        "mask requiring grad": (
            (q.clone().requires_grad_(), k, v),
            {"attn_mask": torch.zeros(16, 16, dtype=torch.bfloat16, requires_grad=True)},
            "attn_mask requires grad",
        ),
        "float32": (tuple(t.float() for t in (q, k, v)), {}, "dtype torch.float32"),
        "3-D": ((q[0], k[0], v[0]), {}, "must have 4 dimensions"),
        "head dim 192": (qkv(d=192), {}, "no quantized kernel for this call on cpu: head_dim > 128"),
        "value head dim differs": ((q, k, qkv(d=64)[2]), {}, "k and v must have the same shape"),
        "GQA without enable_gqa": (qkv(hkv=1), {}, "head counts"),
        "heads do not divide": (qkv(hq=3, hkv=2), {"enable_gqa": True}, "must be a multiple"),
        "mask with is_causal": ((q, k, v), {"attn_mask": mask, "is_causal": True}, "is_causal"),
        "float mask of another dtype": ((q, k, v), {"attn_mask": torch.zeros(16, 16)}, "attn_mask dtype"),
        "1-D mask": ((q, k, v), {"attn_mask": torch.ones(16, dtype=torch.bool)}, "attn_mask of shape"),
        "mask not broadcastable": ((q, k, v), {"attn_mask": mask[:, :8]}, "attn_mask of shape"),
        "strided last dim": ((qkv(d=16, n=32)[0].transpose(-1, -2), k, v), {}, "contiguous last dimension"),
        "negative scale": ((q, k, v), {"scale": -1.0}, "scale must be a positive finite number"),
        "head dim 0": (qkv(d=0), {}, "head_dim (the last dimension of q) must be at least 1"),
        "tensor subclass": ((_subclass(q), k, v), {}, "subclass"),
    }


@pytest.mark.parametrize("case", sorted(_unsupported_cases()))
def test_unsupported_calls_reach_the_original_with_their_arguments(case, triton_standin):
    args, kwargs, reason = _unsupported_cases()[case]
    original = Recorder()
    patch = smp.SageSDPA(original, devices=("cpu",), warn=False)
    torch.manual_seed(0)
    try:
        expected = SDPA(*args, **kwargs)
    except (RuntimeError, IndexError, ValueError) as refused:  # SDPA refuses it: so must the patch
        with pytest.raises(type(refused)):
            patch(*args, **kwargs)
    else:
        torch.manual_seed(0)  # the same dropout pattern
        out = patch(*args, **kwargs)
        torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)
    assert not triton_standin.calls, "the call went to sageattn"
    (got_args, got_kwargs), = original.calls  # fmt: skip
    assert all(a is b for a, b in zip(got_args, args))
    for name, value in kwargs.items():
        assert got_kwargs[name] is value or got_kwargs[name] == value, name
    assert set(got_kwargs) <= {"attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"}
    (counted,) = patch.calls
    assert counted.startswith("original: ") and reason in counted, counted


def test_cpu_tensors_go_to_the_original_by_default():
    original = Recorder()
    patch = smp.SageSDPA(original, warn=False)
    patch(*qkv())
    assert len(original.calls) == 1 and list(patch.calls) == ["original: cpu tensors"]


def test_no_quantized_kernel_here_goes_to_the_original():
    """The CPU admitted, but no backend of sageattn quantizes on it: the original, not sageattn's own SDPA."""
    original = Recorder()
    patch = smp.SageSDPA(original, devices=("cpu",), warn=False)
    patch(*qkv())
    (reason,) = patch.calls
    assert "no quantized kernel" in reason and len(original.calls) == 1


def _supported_cases():
    q, k, v = qkv(n=96, d=64)
    keep = torch.rand(1, 1, 96, 96, generator=torch.Generator().manual_seed(1)) > 0.3
    nhd = qkv(n=96, d=64, seed=2)
    return {
        "plain": ((q, k, v), {}),
        "causal": ((q, k, v), {"is_causal": True}),
        "GQA": (qkv(hq=4, hkv=2, n=96, d=64), {"enable_gqa": True}),
        "bool mask": ((q, k, v), {"attn_mask": keep}),
        "additive mask": ((q, k, v), {"attn_mask": torch.where(keep, 0.0, -1e4).to(q.dtype)}),
        "2-D mask": ((q, k, v), {"attn_mask": keep[0, 0]}),
        "scale": ((q, k, v), {"scale": 0.05}),
        "strided (NHD memory)": (tuple(t.transpose(1, 2).contiguous().transpose(1, 2) for t in nhd), {}),
        "keyword names": ((), {"query": q, "key": k, "value": v}),
        "q_len != kv_len, causal": ((q[:, :, :40], k, v), {"is_causal": True}),
    }


@pytest.mark.parametrize("case", sorted(_supported_cases()))
def test_supported_calls_go_to_sageattn_and_agree_with_sdpa(case, triton_standin):
    args, kwargs = _supported_cases()[case]
    original = Recorder()
    patch = smp.SageSDPA(original, devices=("cpu",), warn=False)
    out = patch(*args, **kwargs)
    ref = SDPA(*args, **kwargs)
    assert not original.calls and dict(patch.calls) == {smp.SAGE: 1}
    assert len(triton_standin.calls) == 1
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert cosine(out, ref) > 0.998  # FP8 P·V, simulated


def test_sageattn_falling_back_inside_the_patch_reaches_the_original(monkeypatch):
    """sageattn's own SDPA fallback calls F.scaled_dot_product_attention: with the patch installed that
    is the patch again, which must hand the inner call to the original instead of recursing."""
    monkeypatch.setattr(smp, "_quantized_here", lambda *args: True)  # pretend sageattn quantizes here
    counted = Recorder()
    monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
    patch = smp.install(devices=("cpu",), warn=False)
    q, k, v = qkv()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sageattn's own fallback warning
        out = F.scaled_dot_product_attention(q, k, v)
    assert dict(patch.calls) == {smp.SAGE: 1} and len(counted.calls) == 1
    torch.testing.assert_close(out, SDPA(q, k, v))
    smp.uninstall()


def test_autocast_float32_goes_to_sageattn_in_the_autocast_dtype(triton_standin):
    patch = smp.SageSDPA(Recorder(), devices=("cpu",), warn=False)
    q, k, v = (t.float() for t in qkv(n=64, d=64))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = patch(q, k, v)
    assert dict(patch.calls) == {smp.SAGE: 1} and out.dtype == torch.bfloat16
    assert cosine(out, SDPA(q, k, v)) > 0.998


def test_autocast_casts_other_float_dtypes_too(triton_standin):
    patch = smp.SageSDPA(Recorder(), devices=("cpu",), warn=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = patch(*qkv(n=64, d=64, dtype=torch.float16))
    assert dict(patch.calls) == {smp.SAGE: 1} and out.dtype == torch.bfloat16


def test_autocast_with_a_float_mask_goes_to_the_original(triton_standin):
    original = Recorder()
    patch = smp.SageSDPA(original, devices=("cpu",), warn=False)
    q, k, v = (t.float() for t in qkv())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        patch(q, k, v, attn_mask=torch.zeros(16, 16))
    assert list(patch.calls) == ["original: a float attn_mask under autocast"] and len(original.calls) == 1


def test_install_uninstall_and_patched_restore_the_original():
    patch = smp.install()
    assert F.scaled_dot_product_attention is patch and smp.install() is patch
    with smp.patched() as inner:
        assert inner is patch  # an installed patch is reused
    smp.uninstall()
    assert F.scaled_dot_product_attention is SDPA
    smp.uninstall()  # nothing installed: nothing happens
    with pytest.raises(KeyError):
        with smp.patched(warn=False) as block:
            assert F.scaled_dot_product_attention is block and block.original is SDPA
            raise KeyError("inside")
    assert F.scaled_dot_product_attention is SDPA


def test_each_reason_warns_once():
    patch = smp.SageSDPA(Recorder())
    q, k, v = qkv()
    with pytest.warns(smp.SDPAFallbackWarning, match="cpu tensors") as record:
        for _ in range(3):
            patch(q, k, v)
    assert len(record) == 1 and patch.calls["original: cpu tensors"] == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        smp.SageSDPA(Recorder(), warn=False)(q, k, v)


def test_script_checks_run_on_the_cpu():
    """The script's own table: on a machine without GPU every call goes to the original, unchanged."""
    rows = script.check_calls(torch.device("cpu"), n=32)
    assert rows and all(row["went to"] == "original: cpu tensors" for row in rows)
    assert all(row["cos vs original"] == pytest.approx(1.0, abs=1e-6) for row in rows)


def test_training_calls_go_to_sageattn_with_gradients(triton_standin):
    q, k, v = (t.requires_grad_() for t in qkv(hq=4, hkv=2))
    patch = smp.SageSDPA(Recorder(), devices=("cpu",), warn=False)
    out = patch(q, k, v, is_causal=True, enable_gqa=True)
    assert patch.calls == {smp.SAGE: 1} and triton_standin.calls
    out.float().sum().backward()
    for x in (q, k, v):
        assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


# --------------------------------------------------------------------------------------------------
# The rules come from the library: when it serves a new case, the patch follows


def test_a_larger_head_dim_limit_of_the_library_is_followed(monkeypatch, triton_standin):
    patch = smp.SageSDPA(Recorder(), devices=("cpu",), warn=False)
    args = qkv(d=192)
    assert "head_dim > 128" in patch.why_not(*args)
    monkeypatch.setattr(dispatch, "MAX_HEAD_DIM", 256)  # the backends learn head dims up to 256
    smp.reset()
    assert patch.why_not(*args) is None


def test_a_backend_without_masks_sends_masked_calls_to_the_original(monkeypatch, triton_standin):
    import dataclasses

    table = tuple(
        dataclasses.replace(e, backend=dataclasses.replace(e.backend, masks=False))
        if e.backend.name.startswith("triton")
        else e
        for e in dispatch.TABLE
    )
    monkeypatch.setattr(dispatch, "TABLE", table)
    smp.reset()
    original = Recorder()
    patch = smp.SageSDPA(original, devices=("cpu",), warn=False)
    q, k, v = qkv()
    patch(q, k, v, attn_mask=torch.ones(16, 16, dtype=torch.bool))
    patch(q, k, v)
    assert len(original.calls) == 1 and patch.calls[smp.SAGE] == 1
    (reason,) = [r for r in patch.calls if r != smp.SAGE]
    assert "no attn_mask support" in reason, reason


def test_mask_gradients_follow_the_library(monkeypatch, triton_standin):
    patch = smp.SageSDPA(Recorder(), devices=("cpu",), warn=False)
    q, k, v = qkv()
    mask = torch.zeros(16, 16, dtype=torch.bfloat16, requires_grad=True)
    assert "attn_mask requires grad" in patch.why_not(q, k, v, mask)
    with torch.no_grad():  # no gradient recorded: the mask is a plain input
        assert patch.why_not(q, k, v, mask) is None
    from sageattention import autograd

    monkeypatch.setattr(autograd, "check_mask_grad", lambda mask: None)  # the library learns mask grads
    assert patch.why_not(q, k, v, mask) is None


def test_a_device_the_library_serves_needs_no_devices_option(triton_standin):
    """devices=None: any device type the dispatch table gives a quantized backend (here the stand-in)."""
    patch = smp.SageSDPA(Recorder(), devices=None, warn=False)
    patch(*qkv(n=32))
    assert dict(patch.calls) == {smp.SAGE: 1}


def test_unpatched_and_installed():
    assert smp.installed() is None and smp.unpatched() is SDPA
    patch = smp.install()
    with smp.patched(smp.SageSDPA(F.scaled_dot_product_attention)):
        assert smp.unpatched() is SDPA  # through both layers
    assert smp.installed() is patch
    text = smp.format_calls(patch)
    assert text.startswith("scaled_dot_product_attention calls: 0 (0 to sageattn, 0 to the original)")
