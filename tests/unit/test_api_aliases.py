"""FlashAttention's keyword names, accepted as aliases: ``causal`` is ``is_causal``, ``softmax_scale`` is
``sm_scale``, on sageattn, sageattn_varlen and every named variant. An alias and its parameter given with
different values raise TypeError naming both; the same value twice is accepted; every other unknown
keyword is still refused. Calls without keyword options never look for aliases."""

from __future__ import annotations

import warnings

import pytest
import torch

import sageattention as sa
from sageattention import core, dispatch

ALL = list(core.PUBLIC_FUNCTIONS)
DENSE = [fn for fn in ALL if fn is not sa.sageattn_varlen]


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sa.SageAttentionFallbackWarning)
        yield


@pytest.fixture
def sdpa_everywhere(monkeypatch):
    """Every entry point, the named variants included, served by torch SDPA on the CPU, so that what
    reaches the backend can be compared between an alias and its parameter."""
    monkeypatch.setattr(dispatch, "select", lambda *args: "sdpa")


def _dense(layout="HND", seed=0):
    gen = torch.Generator().manual_seed(seed)
    shape_q, shape_k = ((1, 4, 24, 32), (1, 2, 24, 32))
    if layout == "NHD":
        shape_q, shape_k = ((1, 24, 4, 32), (1, 24, 2, 32))
    return (
        torch.randn(shape_q, generator=gen).half(),
        torch.randn(shape_k, generator=gen).half(),
        torch.randn(shape_k, generator=gen).half(),
    )


def _varlen(seed=0):
    gen = torch.Generator().manual_seed(seed)
    lens = [5, 11, 8]
    cu = torch.tensor([0, 5, 16, 24], dtype=torch.int32)
    q = torch.randn(sum(lens), 4, 32, generator=gen).half()
    k, v = (torch.randn(sum(lens), 2, 32, generator=gen).half() for _ in range(2))
    return (q, k, v, cu, cu, max(lens), max(lens))


def _call(fn, **kw):
    args = _varlen() if fn is sa.sageattn_varlen else _dense()
    return fn(*args, **kw)


def _name(fn):
    return fn.__name__


@pytest.mark.parametrize("fn", ALL, ids=_name)
def test_causal_is_is_causal(fn, sdpa_everywhere):
    named = _call(fn, is_causal=True)
    aliased = _call(fn, causal=True)
    torch.testing.assert_close(aliased, named, rtol=0, atol=0)
    assert not torch.equal(_call(fn), named)  # the flag has an effect, so the alias was not dropped
    torch.testing.assert_close(_call(fn, causal=False), _call(fn), rtol=0, atol=0)


@pytest.mark.parametrize("fn", ALL, ids=_name)
def test_softmax_scale_is_sm_scale(fn, sdpa_everywhere):
    named = _call(fn, sm_scale=0.4)
    aliased = _call(fn, softmax_scale=0.4)
    torch.testing.assert_close(aliased, named, rtol=0, atol=0)
    assert not torch.equal(_call(fn), named)
    torch.testing.assert_close(_call(fn, softmax_scale=None), _call(fn), rtol=0, atol=0)


@pytest.mark.parametrize("fn", ALL, ids=_name)
def test_both_aliases_together_and_with_other_options(fn, sdpa_everywhere):
    named = _call(fn, is_causal=True, sm_scale=0.3, smooth_k=False)
    aliased = _call(fn, causal=True, softmax_scale=0.3, smooth_k=False, qk_quant_gran="per_thread")
    torch.testing.assert_close(aliased, named, rtol=0, atol=0)


@pytest.mark.parametrize("fn", ALL, ids=_name)
def test_the_same_value_twice_is_accepted(fn, sdpa_everywhere):
    named = _call(fn, is_causal=True, sm_scale=0.25)
    both = _call(fn, is_causal=True, causal=True, sm_scale=0.25, softmax_scale=0.25)
    torch.testing.assert_close(both, named, rtol=0, atol=0)
    torch.testing.assert_close(_call(fn, is_causal=1, causal=True, sm_scale=0.25), named, rtol=0, atol=0)


@pytest.mark.parametrize("fn", ALL, ids=_name)
@pytest.mark.parametrize(
    "kw,pattern",
    [
        ({"is_causal": True, "causal": False}, r"got is_causal=True and its alias causal=False"),
        ({"sm_scale": 0.3, "softmax_scale": 0.2}, r"got sm_scale=0.3 and its alias softmax_scale=0.2"),
        ({"sm_scale": 0.3, "softmax_scale": None}, r"got sm_scale=0.3 and its alias softmax_scale=None"),
    ],
    ids=["causal", "scale", "scale_none"],
)
def test_conflicting_values_raise_naming_both(fn, kw, pattern):
    # raised before anything runs: also for the named variants that cannot run on this machine
    with pytest.raises(TypeError, match=rf"^{fn.__name__}\(\) {pattern}"):
        _call(fn, **kw)


def test_conflicts_by_position_too():
    q, k, v = _dense()
    with pytest.raises(TypeError, match=r"is_causal=True and its alias causal=False"):
        sa.sageattn(q, k, v, "HND", True, causal=False)
    with pytest.raises(TypeError, match=r"sm_scale=0.5 and its alias softmax_scale=0.25"):
        sa.sageattn(q, k, v, "HND", False, 0.5, softmax_scale=0.25)


def test_a_parameter_at_its_default_counts_as_not_given(sdpa_everywhere):
    q, k, v = _dense()
    named = sa.sageattn(q, k, v, is_causal=True, sm_scale=0.3)
    torch.testing.assert_close(sa.sageattn(q, k, v, is_causal=False, sm_scale=None, causal=True,
                                           softmax_scale=0.3), named, rtol=0, atol=0)  # fmt: skip


@pytest.mark.parametrize("fn", ALL, ids=_name)
@pytest.mark.parametrize(
    "kw,exc,pattern",
    [
        ({"causal": "yes"}, TypeError, r"^causal must be a bool"),
        ({"causal": None}, TypeError, r"^causal must be a bool"),
        ({"causal": torch.tensor(True)}, TypeError, r"^causal must be a bool"),
        ({"softmax_scale": "0.1"}, TypeError, r"^softmax_scale must be a Python float"),
        ({"softmax_scale": True}, TypeError, r"^softmax_scale must be a Python float"),
        ({"softmax_scale": -1.0}, ValueError, r"^softmax_scale must be a positive finite number"),
        ({"softmax_scale": float("nan")}, ValueError, r"^softmax_scale must be a positive finite number"),
    ],
    ids=["causal_str", "causal_none", "causal_tensor", "scale_str", "scale_bool", "scale_neg", "scale_nan"],
)
def test_alias_values_are_checked_under_their_own_name(fn, kw, exc, pattern):
    with pytest.raises(exc, match=pattern):
        _call(fn, **kw)


@pytest.mark.parametrize("fn", ALL, ids=_name)
@pytest.mark.parametrize("key", ["dropout_p", "scale", "window_size", "alibi_slopes", "is_casual", "Causal"])
def test_other_unknown_keywords_are_still_refused(fn, key):
    with pytest.raises(TypeError, match=rf"^{fn.__name__}\(\) got unexpected keyword argument\(s\) '{key}'"):
        _call(fn, causal=True, **{key: None})


def test_the_refusal_lists_the_aliases():
    with pytest.raises(TypeError, match=r"aliases: causal \(= is_causal\), softmax_scale \(= sm_scale\)$"):
        _call(sa.sageattn, dropout_p=0.0)


def test_varlen_refuses_the_dense_only_options_next_to_an_alias():
    pattern = r"sageattn_varlen\(\) got unexpected keyword argument\(s\) 'attn_mask'"
    with pytest.raises(TypeError, match=pattern):
        _call(sa.sageattn_varlen, causal=True, attn_mask=None)


@pytest.mark.parametrize("fn", ALL, ids=_name)
def test_no_alias_lookup_without_keyword_options(fn, monkeypatch):
    """The eager host path: a call without **kwargs does not look for aliases."""

    def refuse(*args):
        raise AssertionError("looked for aliases")

    monkeypatch.setattr(core, "resolve_aliases", refuse)
    monkeypatch.setattr(dispatch, "select", lambda *args: "sdpa")
    _call(fn, is_causal=True, sm_scale=0.3)
    with pytest.raises(AssertionError, match="looked for aliases"):
        _call(fn, causal=True)


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_aliases_with_return_lse_on_the_fallback(layout):
    """The call ring engines make: tensor_layout, return_lse, causal and softmax_scale."""
    q, k, v = _dense(layout)
    common = {"tensor_layout": layout, "return_lse": True}
    out, lse = sa.sageattn(q, k, v, causal=True, softmax_scale=0.2, **common)
    ref_out, ref_lse = sa.sageattn(q, k, v, is_causal=True, sm_scale=0.2, **common)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=0)


def test_the_docstrings_name_the_aliases():
    for fn in ALL:
        doc = " ".join(fn.__doc__.split())
        assert "causal and softmax_scale" in doc and "aliases of is_causal and sm_scale" in doc, fn.__name__
