"""The sm90 call plan (dispatch.call_plan, cuda_ops.Sm90Call) against the whole way: a second eager
sageattn call of a signature runs the plan its first call made, and gives the same bits, in the same
layout and strides, for both layouts, causal, GQA, the LSE and awkward lengths; on another stream and
in a CUDA graph as well; and for key-padding masks, whose signatures have plans of their own."""

from __future__ import annotations

import pytest
import torch

import sageattention as sa
from sageattention import core, cuda_ops, dispatch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs an sm90 GPU", allow_module_level=True)
if not cuda_ops.register(cuda_ops.SM90):
    pytest.skip("sageattention._qattn_sm90 is not built", allow_module_level=True)


def _inputs(mma, b, hq, hkv, n, d, layout, seed=0):
    q = mma.make(b, hq, n, d, "HND", torch.bfloat16, seed)
    k, v = (mma.make(b, hkv, n, d, "HND", torch.bfloat16, seed + i) for i in (1, 2))
    if layout == "NHD":  # the caller's tensors: NHD memory, NHD shape
        q, k, v = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    return q, k, v


SHAPES = [(1, 8, 8, 1, 64), (2, 4, 4, 17, 128), (1, 8, 2, 113, 128), (2, 2, 1, 1000, 64),
          (1, 2, 2, 4095, 128), (1, 3, 3, 64, 72)]  # fmt: skip


def _plan_of(q, k, v, layout, is_causal, return_lse):
    return dispatch.call_plan(core.call_key(q, k, v, layout, is_causal, None, return_lse))


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("return_lse", [False, True], ids=["out", "lse"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("b,hq,hkv,n,d", SHAPES)
def test_planned_call_gives_the_same_bits(mma, layout, return_lse, is_causal, b, hq, hkv, n, d):
    q, k, v = _inputs(mma, b, hq, hkv, n, d, layout)
    first = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=is_causal, return_lse=return_lse)
    assert isinstance(_plan_of(q, k, v, layout, is_causal, return_lse), cuda_ops.Sm90Call)
    second = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=is_causal, return_lse=return_lse)
    for a, b_ in zip(*(x if return_lse else (x,) for x in (first, second))):
        assert a.shape == b_.shape and a.stride() == b_.stride() and a.dtype == b_.dtype
        assert torch.equal(a, b_)


def test_head_dims_for_triton_have_no_plan(mma):
    q, k, v = _inputs(mma, 1, 2, 2, 64, 36, "HND")  # not a multiple of 8: the Triton kernels serve it
    sa.sageattn(q, k, v)
    assert _plan_of(q, k, v, "HND", False, False) is False


def test_planned_call_on_another_stream_and_in_a_graph(mma):
    q, k, v = _inputs(mma, 2, 8, 8, 256, 128, "NHD")
    want = sa.sageattn(q, k, v, tensor_layout="NHD")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = sa.sageattn(q, k, v, tensor_layout="NHD")
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(got, want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = sa.sageattn(q, k, v, tensor_layout="NHD")
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, sa.sageattn(q, k, v, tensor_layout="NHD"))


def test_inputs_that_need_a_gradient_still_get_one(mma):
    q, k, v = _inputs(mma, 1, 2, 2, 128, 64, "HND")
    sa.sageattn(q, k, v)  # the plan exists
    qg = q.detach().clone().requires_grad_()
    sa.sageattn(qg, k, v).sum().backward()
    assert qg.grad is not None and qg.grad.abs().sum() > 0


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("b,hq,hkv,n,d", [(2, 16, 16, 2048, 128), (3, 4, 2, 1000, 64), (2, 2, 1, 17, 72)])
def test_planned_masked_call_gives_the_same_bits(mma, layout, b, hq, hkv, n, d):
    """A key-padding mask's signature has a plan of its own: the same bits as the whole way, for the mask
    of each call (new values through the same plan), and in a CUDA graph."""
    q, k, v = _inputs(mma, b, hq, hkv, n, d, layout)
    gen = torch.Generator(device="cuda").manual_seed(5)
    keep = torch.rand(b, 1, 1, n, device="cuda", generator=gen) < 0.75
    first = sa.sageattn(q, k, v, tensor_layout=layout, attn_mask=keep, return_lse=True)
    key = core.call_key(q, k, v, layout, False, None, True, keep)
    assert isinstance(dispatch.call_plan(key), cuda_ops.Sm90Call)
    second = sa.sageattn(q, k, v, tensor_layout=layout, attn_mask=keep, return_lse=True)
    for a, b_ in zip(first, second):
        assert a.shape == b_.shape and a.stride() == b_.stride() and torch.equal(a, b_)
    other = torch.rand(b, 1, 1, n, device="cuda", generator=gen) < 0.5
    planned = sa.sageattn(q, k, v, tensor_layout=layout, attn_mask=other)
    dispatch.reset()  # the whole way for the other mask
    assert torch.equal(planned, sa.sageattn(q, k, v, tensor_layout=layout, attn_mask=other))
    sa.sageattn(q, k, v, tensor_layout=layout, attn_mask=keep)  # planned again
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = sa.sageattn(q, k, v, tensor_layout=layout, attn_mask=keep)
    keep.copy_(other)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, planned)
