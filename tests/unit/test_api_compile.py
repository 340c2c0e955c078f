"""torch.compile(fullgraph=True) through the public API, on the CPU (backend "aot_eager", which
traces with the fake implementations and runs the real ones): no graph break, same results as eager,
for the SDPA fallback and for the Triton route (played by the stand-in through the custom ops)."""

from __future__ import annotations

import warnings

import pytest
import torch

import sageattention as sa


def _compile(fn, **kw):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="aot_eager", **kw)


def _recording_backend(graphs):
    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return backend


def _ops_in(graphs):
    return {str(node.target) for gm in graphs for node in gm.graph.nodes if node.op == "call_function"}


def _attend(q, k, v, mask):
    out, lse = sa.sageattn(q, k, v, tensor_layout="NHD", is_causal=True, attn_mask=mask, return_lse=True)
    return out.float() * 2, lse


@pytest.mark.parametrize("dynamic", [False, True])
def test_fallback_compiles_without_graph_break(inputs, dynamic):
    q, k, v = inputs.make_qkv(1, 4, 2, 12, 12, 32, layout="NHD")
    mask = torch.rand(12, 12, generator=torch.Generator().manual_seed(0)) > 0.3
    compiled = _compile(_attend, dynamic=dynamic)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sa.SageAttentionFallbackWarning)
        got, expected = compiled(q, k, v, mask), _attend(q, k, v, mask)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dynamic", [False, True])
def test_triton_route_compiles_to_the_custom_op(inputs, triton_standin, dynamic):
    graphs = []
    compiled = torch.compile(_attend, fullgraph=True, backend=_recording_backend(graphs), dynamic=dynamic)
    torch._dynamo.reset()
    for n in (12, 20):  # a second length: a recompile (static) or the same dynamic graph
        q, k, v = inputs.make_qkv(1, 4, 2, n, n, 32, layout="NHD", seed=n)
        mask = torch.ones(n, n, dtype=torch.bool)
        got, expected = compiled(q, k, v, mask), _attend(q, k, v, mask)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b)
    assert any(t.startswith("sageattention.triton_attn") for t in _ops_in(graphs))
    assert all(call["pv"].value == "fp8" for call in triton_standin.calls)


def test_triton_route_under_aot_eager(inputs, triton_standin):
    q, k, v = inputs.make_qkv(2, 8, 2, 16, 24, 64)
    fn = lambda q, k, v: sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, is_causal=True)  # noqa: E731
    torch.testing.assert_close(_compile(fn)(q, k, v), fn(q, k, v))


def test_varlen_compiles_to_the_custom_op(triton_standin):
    graphs = []
    fn = lambda q, k, v, cq, ck: sa.sageattn_varlen(q, k, v, cq, ck, 7, 6, is_causal=True)  # noqa: E731
    compiled = torch.compile(fn, fullgraph=True, backend=_recording_backend(graphs))
    torch._dynamo.reset()
    cq = torch.tensor([0, 3, 10], dtype=torch.int32)
    ck = torch.tensor([0, 6, 8], dtype=torch.int32)
    q, k, v = torch.randn(10, 4, 32).half(), torch.randn(8, 2, 32).half(), torch.randn(8, 2, 32).half()
    torch.testing.assert_close(compiled(q, k, v, cq, ck), fn(q, k, v, cq, ck))
    assert any(t.startswith("sageattention.triton_varlen") for t in _ops_in(graphs))


def test_bad_arguments_still_raise_under_compile(inputs):
    q, k, v = inputs.make_qkv()
    compiled = _compile(lambda q, k, v: sa.sageattn(q, k, v, tensor_layout="XYZ"))
    with pytest.raises(Exception, match="tensor_layout"):
        compiled(q, k, v)


def test_named_variant_options_trace_without_graph_break():
    """The named variants parse qk_quant_gran / pv_accum_dtype strings inside the traced region."""
    from sageattention._checks import check_pv_accum, check_qk_quant_gran

    def fn(x):
        gran = check_qk_quant_gran("per_thread", ("per_warp", "per_thread"))
        accum = check_pv_accum("fp32+fp16")
        return x * (2 if gran.value == "per_thread" else 3) + (1 if accum.value == "fp32+fp16" else 0)

    x = torch.ones(3)
    torch.testing.assert_close(_compile(fn)(x), fn(x))
