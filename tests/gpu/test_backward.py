"""Gradients through sageattn on a GPU: the issue's accuracy protocol, torch.compile, CUDA graphs.

Accuracy: b=1 h=8 n=4096 d=128 bf16, randn and outlier inputs (tests/gpu/conftest.py protocol_inputs),
causal and not, MHA and GQA 4:1; dQ, dK and dV of the training call (quantized forward, the default
high-precision backward) against float64 autograd of the exact attention: cosine >= 0.9995 and
relative L1 <= 0.03 each, never NaN, never missing or zero. Each backward of the table that can serve
the call (triton, flash, cudnn) is held to the same bar, fed the same saved output and LSE; the
quantized one (int8) to cosine >= 0.995.
"""

from __future__ import annotations

import math

import pytest
import torch

import sageattention as sa
from sageattention import autograd
from sageattention.reference import attention_ref

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("sageattention.triton")

MIN_COS, MAX_L1 = 0.9995, 0.03
#: The quantized backward's bar (the issue's cosine; its relative L1, unbounded there, is held loosely).
BOUNDS = {"int8": (0.995, 0.1)}


def _stats(got, ref):
    g, r = got.double().flatten(), ref.double().flatten()
    return float(g @ r / (g.norm() * r.norm()).clamp_min(1e-300)), float((g - r).abs().sum() / r.abs().sum())


def assert_grad(got, ref, what, min_cos=MIN_COS, max_l1=MAX_L1):
    assert got is not None, f"{what}: no gradient"
    assert not torch.isnan(got).any(), f"{what}: NaN"
    assert torch.isfinite(got).all(), f"{what}: Inf"
    assert got.abs().sum() > 0, f"{what}: zero"
    cos, l1 = _stats(got, ref)
    print(f"{what}: cos {cos:.6f} rel L1 {l1:.5f}")
    assert cos >= min_cos and l1 <= max_l1, (
        f"{what}: cos {cos:.6f} (>= {min_cos}), rel L1 {l1:.5f} (<= {max_l1})"
    )


def reference_grads(q, k, v, dout, *, is_causal, mask=None, dlse=None, layout="NHD"):
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    out, lse = attention_ref(
        qd, kd, vd, tensor_layout=layout, is_causal=is_causal, attn_mask=mask, return_lse=True
    )
    loss = (out * dout.double()).sum()
    if dlse is not None:
        loss = loss + (torch.where(torch.isinf(lse), 0.0, lse) * dlse.double()).sum()
    grads = torch.autograd.grad(loss, (qd, kd, vd))
    return grads


def _inputs(mma, kind, groups, seed=0):
    # protocol_inputs gives [B, H, N, D] views of NHD memory: the NHD tensors [1, 4096, 8, 128] bf16
    q, k, v = (x.transpose(1, 2) for x in mma.protocol_inputs(kind, seed))
    assert q.shape == (1, 4096, 8, 128) and q.is_contiguous()
    if groups > 1:
        k, v = k[:, :, ::groups].contiguous(), v[:, :, ::groups].contiguous()  # 8 q heads, 2 kv heads
    gen = torch.Generator(device="cuda").manual_seed(seed + 50)
    dout = torch.randn(q.shape, device="cuda", generator=gen).to(q.dtype)
    return [x.detach().clone().requires_grad_() for x in (q, k, v)], dout


@pytest.mark.parametrize("backward", [None, "int8"], ids=["default", "int8"])
@pytest.mark.parametrize("groups", [1, 4], ids=["mha", "gqa4"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kind", ["randn", "outlier"])
def test_protocol_gradients(mma, kind, causal, groups, backward):
    (q, k, v), dout = _inputs(mma, kind, groups)
    with autograd.backward_order(backward):
        out = sa.sageattn(q, k, v, tensor_layout="NHD", is_causal=causal)
        torch.autograd.backward(out, dout)
    ref = reference_grads(q, k, v, dout, is_causal=causal)
    for name, x, r in zip("qkv", (q, k, v), ref):
        assert_grad(x.grad, r, f"{backward or 'default'} {kind} causal={causal} groups={groups} d{name}",
                    *BOUNDS.get(backward, (MIN_COS, MAX_L1)))  # fmt: skip


@pytest.mark.parametrize("impl", ["triton", "int8", "flash", "cudnn"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_each_backward_of_the_table(mma, impl, causal):
    (q, k, v), dout = _inputs(mma, "randn", 1, seed=3)
    qh, kh, vh, doh = (x.detach().transpose(1, 2) for x in (q, k, v, dout))
    why = autograd.BACKWARDS[impl].cannot_run(autograd._request(qh, kh, None, None, causal, False))
    if why is not None:
        pytest.skip(f"{impl}: {why}")
    out, lse = sa.sageattn(qh, kh, vh, is_causal=causal, return_lse=True)
    got = autograd.BACKWARDS[impl].dense(doh, qh, kh, vh, out, lse, None, None, causal, 128**-0.5)
    ref = reference_grads(qh, kh, vh, doh, is_causal=causal, layout="HND")
    for name, g, r, x in zip("qkv", got, ref, (qh, kh, vh)):
        assert g.shape == x.shape and g.dtype == x.dtype
        assert_grad(g, r, f"{impl} causal={causal} d{name}", *BOUNDS.get(impl, (MIN_COS, MAX_L1)))


@pytest.mark.parametrize("backward", [None, "int8"], ids=["default", "int8"])
def test_masks_lse_grad_and_varlen_on_gpu(backward):
    """Smaller shapes through every option: bool and additive masks with causal, return_lse with its
    gradient, HND and NHD, padded head dims, packed sequences; with the default backward and the
    quantized one."""
    with autograd.backward_order(backward):
        _masks_lse_grad_and_varlen(*BOUNDS.get(backward, (0.999, 0.04)))


def _masks_lse_grad_and_varlen(min_cos, max_l1):
    gen = torch.Generator(device="cuda").manual_seed(1)

    def leaf(*shape):
        return torch.randn(*shape, device="cuda", generator=gen).bfloat16().requires_grad_()

    for layout, d in (("HND", 64), ("NHD", 72)):
        shape_q = (2, 8, 333, d) if layout == "HND" else (2, 333, 8, d)
        shape_k = (2, 2, 300, d) if layout == "HND" else (2, 300, 2, d)
        q, k, v = leaf(*shape_q), leaf(*shape_k), leaf(*shape_k)
        keep = torch.rand(2, 1, 333, 300, device="cuda", generator=gen) > 0.2
        keep[..., 0] = True
        for mask in (keep, torch.where(keep, 0.5, -math.inf).bfloat16()):
            for x in (q, k, v):
                x.grad = None
            out, lse = sa.sageattn(
                q, k, v, tensor_layout=layout, is_causal=True, attn_mask=mask, return_lse=True
            )
            dout = torch.randn(out.shape, device="cuda", generator=gen).bfloat16()
            dlse = torch.randn(lse.shape, device="cuda", generator=gen)
            torch.autograd.backward((out, lse), (dout, dlse))
            ref = reference_grads(q, k, v, dout, is_causal=True, mask=mask, dlse=dlse, layout=layout)
            for name, x, r in zip("qkv", (q, k, v), ref):
                assert_grad(x.grad, r, f"{layout} d={d} mask={mask.dtype} d{name}", min_cos, max_l1)
    lens = [100, 513, 7, 300]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q, k, v = leaf(sum(lens), 8, 128), leaf(sum(lens), 2, 128), leaf(sum(lens), 2, 128)
    out = sa.sageattn_varlen(q, k, v, cu, cu, max(lens), max(lens), is_causal=True)
    dout = torch.randn(out.shape, device="cuda", generator=gen).bfloat16()
    torch.autograd.backward(out, dout)
    refs = [torch.zeros(x.shape, dtype=torch.float64, device="cuda") for x in (q, k, v)]
    for i in range(len(lens)):
        s = slice(int(cu[i]), int(cu[i + 1]))
        parts = [x[s].transpose(0, 1)[None] for x in (q, k, v, dout)]
        for r, g in zip(refs, reference_grads(*parts, is_causal=True, layout="HND")):
            r[s] = g[0].transpose(0, 1)
    for name, x, r in zip("qkv", (q, k, v), refs):
        assert_grad(x.grad, r, f"varlen d{name}", min_cos, max_l1)


def _small(seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(2, 1024, 8, 128, device="cuda", generator=gen).bfloat16()
    k, v = (torch.randn(2, 1024, 2, 128, device="cuda", generator=gen).bfloat16() for _ in range(2))
    return [x.requires_grad_() for x in (q, k, v)]


def _loss(q, k, v):
    out, lse = sa.sageattn(q, k, v, tensor_layout="NHD", is_causal=True, return_lse=True)
    return out.float().square().mean() + lse.mean() * 1e-3


def test_compile_fullgraph_forward_and_backward():
    q, k, v = _small()
    torch._dynamo.reset()
    compiled = torch.compile(_loss, fullgraph=True)
    compiled(q, k, v).backward()
    got = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    _loss(q, k, v).backward()
    for name, g, x in zip("qkv", got, (q, k, v)):
        assert_grad(g, x.grad, f"compiled d{name}", min_cos=0.99999, max_l1=1e-3)


def test_cuda_graph_of_forward_and_backward():
    q, k, v = _small(1)
    static = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up (compiles the Triton kernels) outside the capture
        for _ in range(2):
            for x in static:
                x.grad = None
            _loss(*static).backward()
    torch.cuda.current_stream().wait_stream(stream)
    for x in static:
        x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = _loss(*static)
        grads = torch.autograd.grad(loss, static)
    for seed in (2, 3):  # new inputs copied in, the graph replayed: the eager gradients
        fresh = _small(seed)
        for s, f in zip(static, fresh):
            s.data.copy_(f.detach())
        graph.replay()
        torch.cuda.synchronize()
        _loss(*fresh).backward()
        for name, g, x in zip("qkv", grads, fresh):
            assert_grad(g, x.grad, f"graph replay seed={seed} d{name}", min_cos=0.99999, max_l1=1e-3)
