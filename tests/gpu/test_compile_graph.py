"""torch.compile (inductor, fullgraph) and CUDA graph capture of the public API on a GPU."""

from __future__ import annotations

import pytest
import torch

import sageattention as sa

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("sageattention.triton")


def _qkv(n=1000, layout="NHD", seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape_q, shape_kv = (
        ((2, n, 8, 128), (2, n, 2, 128)) if layout == "NHD" else ((2, 8, n, 128), (2, 2, n, 128))
    )
    return tuple(
        torch.randn(s, device="cuda", generator=gen).to(torch.bfloat16) for s in (shape_q, shape_kv, shape_kv)
    )


def block(q, k, v):
    """A small transformer-ish block around sageattn: the graph must not break at the attention."""
    out, lse = sa.sageattn(q * 0.5, k, v, tensor_layout="NHD", is_causal=True, return_lse=True)
    return out.flatten(2) @ torch.ones(out.shape[-2] * out.shape[-1], 16, device=q.device, dtype=q.dtype), lse


def test_no_graph_break():
    q, k, v = _qkv()
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(block)(q, k, v)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


@pytest.mark.parametrize("dynamic", [False, True])
def test_inductor_fullgraph_matches_eager(dynamic, metrics):
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, dynamic=dynamic)
    for n in (1000, 1537):
        q, k, v = _qkv(n, seed=n)
        (a, la), (b, lb) = compiled(q, k, v), block(q, k, v)
        assert metrics.cosine(a, b) >= 0.99999
        torch.testing.assert_close(la, lb)


def test_varlen_compiles():
    lens = [3, 500, 77]
    cu = torch.tensor([0, *lens], device="cuda").cumsum(0).to(torch.int32)
    q = torch.randn(sum(lens), 8, 64, device="cuda", dtype=torch.float16)
    k, v = torch.randn(sum(lens), 2, 64, device="cuda", dtype=torch.float16), torch.randn_like(q[:, :2])
    fn = lambda q, k, v, cu: sa.sageattn_varlen(q, k, v, cu, cu, 500, 500, is_causal=True)  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, cu), fn(q, k, v, cu))


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("with_mask", [False, True])
def test_cuda_graph_capture_and_replay(layout, with_mask):
    static = [x.clone() for x in _qkv(777, layout, seed=1)]
    n = 777
    mask = (torch.rand(n, n, device="cuda") > 0.2) if with_mask else None

    def run():
        return sa.sageattn(*static, tensor_layout=layout, is_causal=True, attn_mask=mask, return_lse=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (Triton compiles here, outside the capture)
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = run()
    for seed in (2, 3):
        for dst, src in zip(static, _qkv(777, layout, seed=seed)):
            dst.copy_(src)
        graph.replay()
        expected_out, expected_lse = run()
        torch.cuda.synchronize()
        assert torch.equal(out, expected_out) and torch.equal(lse, expected_lse)


def test_reduce_overhead_mode():
    """torch.compile's CUDA-graph mode wraps the whole call."""
    torch._dynamo.reset()
    fn = lambda q, k, v: sa.sageattn(q, k, v, tensor_layout="NHD")  # noqa: E731
    compiled = torch.compile(fn, mode="reduce-overhead", fullgraph=True)
    for seed in range(3):
        q, k, v = _qkv(512, seed=seed)
        torch.testing.assert_close(compiled(q, k, v).clone(), fn(q, k, v))


# The compiled kernel families through their public variants (conftest's sage_backend skips those this
# GPU or build cannot run; the mma.sync kernels for sm80/sm89 also run on sm90). The mma.sync kernels
# run a non-default accumulation, so that an option goes through the trace too.
_COMPILED_OPTIONS = {
    "cuda_sm80": {"pv_accum_dtype": "fp16+fp32"},
    "cuda_sm89": {"pv_accum_dtype": "fp32+fp16"},
}


def _compiled_variant(backend):
    if not backend.compiled:
        pytest.skip("not a compiled kernel (sageattn and the Triton kernels are traced above)")
    fn = getattr(sa, backend.function)
    options = _COMPILED_OPTIONS.get(backend.name, {})
    return lambda q, k, v: fn(q, k, v, tensor_layout="NHD", is_causal=True, return_lse=True, **options)


def test_compiled_variant_fullgraph(sage_backend, metrics):
    """torch.compile(fullgraph=True) traces each compiled variant (quantization ops and kernel)."""
    fn = _compiled_variant(sage_backend)
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    for n in (1000, 1537):
        q, k, v = _qkv(n, seed=n)
        (a, la), (b, lb) = compiled(q, k, v), fn(q, k, v)
        assert metrics.cosine(a, b) >= 0.99999
        torch.testing.assert_close(la, lb)


def test_compiled_variant_cuda_graph(sage_backend):
    """Each compiled variant captures into a CUDA graph and replays on new inputs bit for bit."""
    fn = _compiled_variant(sage_backend)
    static = [x.clone() for x in _qkv(777, seed=1)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = fn(*static)
    for seed in (2, 3):
        for dst, src in zip(static, _qkv(777, seed=seed)):
            dst.copy_(src)
        graph.replay()
        expected_out, expected_lse = fn(*static)
        torch.cuda.synchronize()
        assert torch.equal(out, expected_out) and torch.equal(lse, expected_lse)
