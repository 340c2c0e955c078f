"""Gradients through every entry point, on the CPU.

The quantized route is played by the Triton stand-in (conftest: sage_ref on the CPU, the CPU posing as
a GPU), so the autograd glue of sageattention/autograd.py runs as on a GPU: the quantized forward,
then a backward of the table (here the plain-torch one; the Triton kernels run under Triton's CPU
interpreter in test_triton_backward_under_interpreter). Every gradient is held against float64
autograd of the exact attention (sageattention.reference.attention_ref): a missing, zero, NaN or
wrong gradient fails.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import sageattention as sa
from sageattention import autograd
from sageattention.reference import attention_ref

ROOT = Path(__file__).resolve().parents[2]

# Bounds against float64: through the quantized forward (its O and LSE carry the INT8/FP8 error into
# D and P), and for the backward alone, fed the exact O and LSE (float32 arithmetic only).
QUANTIZED = (0.999, 0.04)  # (min cosine, max relative L1)
EXACT = (0.99999, 0.005)


def _cos(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()).clamp_min(1e-300))


def _rel_l1(a, b):
    return float((a.double() - b.double()).abs().sum() / b.double().abs().sum().clamp_min(1e-300))


def assert_grad(got, ref, bounds, what):
    assert got is not None, f"{what}: no gradient"
    assert torch.isfinite(got).all(), f"{what}: NaN or Inf in the gradient"
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    assert float(got.detach().double().abs().sum()) > 0, f"{what}: gradient is zero"
    cos, l1 = _cos(got, ref), _rel_l1(got, ref)
    assert cos >= bounds[0] and l1 <= bounds[1], f"{what}: cos {cos:.6f}, rel L1 {l1:.5f}"


def _leaf(x):
    return x.detach().clone().requires_grad_()


def reference_grads(q, k, v, dout, dlse=None, *, layout="HND", is_causal=False, sm_scale=None, mask=None):
    """Float64 autograd of attention_ref with the loss sum(out * dout) (+ sum(lse * dlse))."""
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    out, lse = attention_ref(qd, kd, vd, tensor_layout=layout, is_causal=is_causal, sm_scale=sm_scale,
                             attn_mask=mask, return_lse=True)  # fmt: skip
    loss = (out * dout.double()).sum()
    if dlse is not None:
        loss = loss + (torch.where(torch.isinf(lse), 0.0, lse) * dlse.double()).sum()
    loss.backward()
    return qd.grad, kd.grad, vd.grad


def _make(inputs, b, hq, hkv, nq, nk, d, layout="HND", seed=0):
    q, k, v = inputs.make_qkv(b, hq, hkv, nq, nk, d, layout=layout, seed=seed)
    gen = torch.Generator().manual_seed(seed + 100)
    dout = torch.randn(q.shape, generator=gen).to(q.dtype)
    return _leaf(q), _leaf(k), _leaf(v), dout


def _mask(kind, b, hq, nq, nk, seed=1):
    gen = torch.Generator().manual_seed(seed)
    if kind is None:
        return None
    keep = torch.rand(b, 1, nq, nk, generator=gen) > 0.3
    keep[..., 0] = True  # every row sees a key (the empty-row case has its own test)
    if kind == "bool":
        return keep
    return torch.where(keep, torch.randn(b, 1, nq, nk, generator=gen), -1e4).to(torch.bfloat16)


# --------------------------------------------------------------------------------------------------
# Inference stays as it was


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "no_requires_grad"])
def test_inference_records_nothing(inputs, triton_standin, monkeypatch, mode):
    def refuse(*args, **kwargs):
        raise AssertionError("the autograd Function ran on an inference call")

    monkeypatch.setattr(autograd._Attention, "apply", refuse)
    monkeypatch.setattr(autograd._VarlenAttention, "apply", refuse)
    q, k, v, _ = _make(inputs, 1, 2, 2, 17, 17, 32)
    if mode == "no_requires_grad":
        q, k, v = q.detach(), k.detach(), v.detach()
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(mode, torch.enable_grad)
    with context():
        out = sa.sageattn(q, k, v, is_causal=True)
        cu = torch.tensor([0, 7, 17], dtype=torch.int32)
        packed = sa.sageattn_varlen(
            q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu, 10, 10
        )
    assert out.grad_fn is None and packed.grad_fn is None
    assert triton_standin.calls[0]["return_lse"] is False  # no LSE asked for, as before


# --------------------------------------------------------------------------------------------------
# The quantized route (stand-in forward, recorded backward)

CASES = [
    # b, hq, hkv, nq, nk, d, layout, causal, mask, return_lse
    (1, 2, 2, 1, 17, 32, "HND", False, None, False),  # one query (decoding)
    (1, 2, 1, 17, 17, 32, "HND", True, None, True),
    (2, 2, 1, 17, 29, 64, "NHD", True, None, False),
    (1, 4, 2, 113, 113, 64, "NHD", False, "bool", True),
    (1, 2, 2, 33, 20, 40, "HND", True, "additive", True),  # padded head dim, nq > nk
    (1, 2, 1, 20, 33, 72, "NHD", False, "additive", False),
]


@pytest.mark.parametrize("b,hq,hkv,nq,nk,d,layout,causal,mask_kind,return_lse", CASES)
def test_quantized_route_gradients(inputs, triton_standin, b, hq, hkv, nq, nk, d, layout, causal, mask_kind,
                                   return_lse):  # fmt: skip
    triton_standin.set_capability((8, 0))  # FP16 P·V: the closer forward, so the bound is tighter
    q, k, v, dout = _make(inputs, b, hq, hkv, nq, nk, d, layout)
    mask = _mask(mask_kind, b, hq, nq, nk)
    scale = 0.2 if d == 40 else None
    res = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=causal, attn_mask=mask, sm_scale=scale,
                      return_lse=return_lse)  # fmt: skip
    out, lse = res if return_lse else (res, None)
    assert out.requires_grad and triton_standin.calls[-1]["return_lse"]  # the LSE is saved for the backward
    loss = (out.float() * dout.float()).sum()
    dlse = None
    if return_lse:
        assert lse.requires_grad
        dlse = torch.randn(lse.shape, generator=torch.Generator().manual_seed(7))
        loss = loss + (lse * dlse).sum()
    loss.backward()
    ref = reference_grads(q, k, v, dout, dlse, layout=layout, is_causal=causal, sm_scale=scale, mask=mask)
    for name, x, r in zip("qkv", (q, k, v), ref):
        assert_grad(x.grad, r, QUANTIZED, f"d{name}")
        assert x.grad.dtype == x.dtype


def test_named_triton_variants_have_gradients(inputs, triton_standin):
    q, k, v, dout = _make(inputs, 1, 2, 1, 17, 17, 32)
    ref = reference_grads(q, k, v, dout, is_causal=True)
    for fn in (sa.sageattn_qk_int8_pv_fp16_triton, sa.sageattn_qk_int8_pv_fp8_triton):
        for x in (q, k, v):
            x.grad = None
        (fn(q, k, v, is_causal=True).float() * dout.float()).sum().backward()
        for name, x, r in zip("qkv", (q, k, v), ref):
            assert_grad(x.grad, r, QUANTIZED, f"{fn.__name__} d{name}")


def test_varlen_gradients(inputs, triton_standin):
    triton_standin.set_capability((8, 0))
    lens_q, lens_k = [5, 17, 1], [9, 17, 3]
    gen = torch.Generator().manual_seed(3)
    q = _leaf(torch.randn(sum(lens_q), 4, 32, generator=gen).bfloat16())
    k = _leaf(torch.randn(sum(lens_k), 2, 32, generator=gen).bfloat16())
    v = _leaf(torch.randn(sum(lens_k), 2, 32, generator=gen).bfloat16())
    dout = torch.randn(q.shape, generator=gen).bfloat16()
    cu_q = torch.tensor([0, 5, 22, 23], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 26, 29], dtype=torch.int32)
    out = sa.sageattn_varlen(q, k, v, cu_q, cu_k, 17, 17, is_causal=True)
    (out.float() * dout.float()).sum().backward()
    refs = [torch.zeros(x.shape, dtype=torch.float64) for x in (q, k, v)]
    for i in range(3):
        sq, sk = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        parts = [x[s].transpose(0, 1)[None] for x, s in ((q, sq), (k, sk), (v, sk), (dout, sq))]
        for r, g, s in zip(refs, reference_grads(*parts, is_causal=True), (sq, sk, sk)):
            r[s] = g[0].transpose(0, 1)
    for name, x, r in zip("qkv", (q, k, v), refs):
        assert_grad(x.grad, r, QUANTIZED, f"varlen d{name}")


# --------------------------------------------------------------------------------------------------
# The plain-torch backward alone, fed the exact forward


@pytest.mark.parametrize("hq,hkv,nq,nk,d,causal,mask_kind,with_dlse,with_lse", [
    (2, 1, 17, 17, 32, True, None, True, True),
    (4, 2, 33, 50, 40, True, "bool", False, True),
    (2, 2, 50, 33, 64, False, "additive", True, False),
])  # fmt: skip
def test_torch_backward_matches_float64(inputs, hq, hkv, nq, nk, d, causal, mask_kind, with_dlse, with_lse,
                                        monkeypatch):  # fmt: skip
    monkeypatch.setattr(autograd, "_TORCH_BLOCK_ELEMENTS", 7 * hq * nk)  # several row blocks
    q, k, v, dout = _make(inputs, 2, hq, hkv, nq, nk, d)
    mask = _mask(mask_kind, 2, hq, nq, nk)
    if mask_kind == "bool":
        mask = mask.clone()
        mask[0, 0, 3] = False  # an empty row: output 0, LSE -inf, no gradient from it
    dlse = torch.randn(2, hq, nq, generator=torch.Generator().manual_seed(5)) if with_dlse else None
    out, lse = attention_ref(q, k, v, is_causal=causal, attn_mask=mask, return_lse=True)
    got = autograd.torch_backward(
        dout,
        q.detach(),
        k.detach(),
        v.detach(),
        out.detach().to(q.dtype),
        lse.float() if with_lse else None,
        dlse,
        mask,
        causal,
        1 / math.sqrt(d),
    )
    ref = reference_grads(q, k, v, dout, dlse, is_causal=causal, mask=mask)
    for name, g, r in zip("qkv", got, ref):
        assert_grad(g, r, EXACT, f"d{name}")


# --------------------------------------------------------------------------------------------------
# The SDPA fallback (the CPU's own route): torch differentiates it


def test_sdpa_fallback_gradients(inputs):
    q, k, v, dout = _make(inputs, 1, 4, 2, 17, 23, 32, layout="NHD")
    mask = _mask("bool", 1, 4, 17, 23)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sa.SageAttentionFallbackWarning)
        out, lse = sa.sageattn(q, k, v, tensor_layout="NHD", is_causal=True, attn_mask=mask, return_lse=True)
    dlse = torch.randn(lse.shape, generator=torch.Generator().manual_seed(2))
    ((out.float() * dout.float()).sum() + (lse * dlse).sum()).backward()
    ref = reference_grads(q, k, v, dout, dlse, layout="NHD", is_causal=True, mask=mask)
    for name, x, r in zip("qkv", (q, k, v), ref):
        assert_grad(x.grad, r, (0.9999, 0.01), f"sdpa d{name}")


# --------------------------------------------------------------------------------------------------
# Refusals: nothing silent


@pytest.mark.parametrize("route", ["quantized", "sdpa"])
def test_mask_requiring_grad_is_refused(inputs, request, route):
    if route == "quantized":
        request.getfixturevalue("triton_standin")
    q, k, v, _ = _make(inputs, 1, 2, 2, 9, 9, 32)
    bias = torch.zeros(9, 9, dtype=torch.bfloat16, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sa.SageAttentionFallbackWarning)
        with pytest.raises(ValueError, match="attn_mask requires grad.*detach"):
            sa.sageattn(q, k, v, attn_mask=bias)
        with pytest.raises(ValueError, match="attn_mask requires grad"):  # also when only the mask does
            sa.sageattn(q.detach(), k.detach(), v.detach(), attn_mask=bias)
        sa.sageattn(q, k, v, attn_mask=bias.detach()).sum().backward()
    assert q.grad is not None


def test_double_backward_is_refused(inputs, triton_standin):
    q, k, v, _ = _make(inputs, 1, 2, 2, 9, 9, 32)
    out = sa.sageattn(q, k, v)
    (gq,) = torch.autograd.grad(out.float().square().sum(), q, create_graph=True)  # dO depends on q
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gq.sum().backward()


# --------------------------------------------------------------------------------------------------
# The table of backwards


def _req(**kw):
    base = {
        "device_type": "cuda",
        "capability": (9, 0),
        "dtype": torch.bfloat16,
        "head_dim": 128,
        "q_heads": 8,
        "kv_heads": 8,
        "has_mask": False,
        "has_dlse": False,
        "is_causal": True,
        "same_len": True,
        "varlen": False,
    }
    return autograd.BackwardRequest(**{**base, **kw})


@pytest.mark.parametrize("is_causal", [False, True])
def test_centered_keys_give_the_kmean_form_of_dq(is_causal):
    """torch's backward kernels fed _centered's K and LSE compute dQ = scale dS (K - mean) and the same
    dK and dV: P is unchanged. Checked with the plain-torch backward, which computes what they do, on an
    output a little off the exact one (as the quantized forward's is), where dS's rows do not sum to 0."""
    gen = torch.Generator().manual_seed(0)
    b, h, n, d = 1, 2, 33, 16
    q, k, v, do = (torch.randn(b, h, n, d, generator=gen, dtype=torch.float64) for _ in range(4))
    k = k + 4.0 * torch.randn(d, generator=gen, dtype=torch.float64)  # a large mean, as in real models
    scale = d**-0.5
    s = q @ k.transpose(-1, -2) * scale
    if is_causal:
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    out = p @ v + 0.01 * torch.randn(b, h, n, d, generator=gen, dtype=torch.float64)
    kc, lse_c = autograd._centered(q, k, lse, scale)
    s_c = q @ kc.transpose(-1, -2) * scale
    if is_causal:
        s_c = s_c.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf)
    torch.testing.assert_close(torch.exp(s_c - lse_c[..., None]), p, rtol=1e-5, atol=1e-6)
    dq, dk, dv = autograd.torch_backward(do, q, kc, v, out, lse_c, None, None, is_causal, scale)
    ds = p * (do @ v.transpose(-1, -2) - (do * out).sum(-1, keepdim=True))
    assert ds.sum(-1).abs().max() > 1e-3  # the case the centering is for
    tol = {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(dq.double(), scale * ds @ (k - k.mean(2, keepdim=True)), **tol)
    torch.testing.assert_close(dk.double(), scale * ds.transpose(-1, -2) @ q, **tol)
    torch.testing.assert_close(dv.double(), p.transpose(-1, -2) @ do, **tol)


def test_cudnn_backward_gets_every_operand_in_q_layout(monkeypatch):
    """cuDNN's backward reads its operands in one layout: q, k, v, O and dO reach it dense in q's memory
    order, whatever layout O and dO come in (a float64 O, HND, with NHD inputs gave garbage)."""
    seen = {}

    def fake(do, q, k, v, out, lse, *args, **kwargs):
        seen.update(do=do, q=q, k=k, v=v, out=out, lse=lse)
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)

    monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention_backward", fake)
    q, k, v = (torch.randn(1, 40, 2, 16).transpose(1, 2) for _ in range(3))  # HND views of NHD memory
    out, do = torch.randn(1, 2, 40, 16), torch.randn(1, 40, 2, 16)[..., :16].transpose(1, 2).contiguous()
    lse = torch.randn(1, 2, 40)
    autograd._cudnn_dense(do, q, k, v, out, lse, None, None, False, 0.25)
    order = autograd._dim_order(q)
    for name in ("q", "k", "v", "out", "do"):
        x = seen[name]
        assert autograd._dim_order(x) == order and x.permute(order).is_contiguous(), name
    torch.testing.assert_close(seen["out"], out)
    torch.testing.assert_close(seen["do"], do)
    assert seen["q"] is q  # already in its own layout: no copy


def test_backward_table(monkeypatch):
    monkeypatch.setattr(autograd.ops, "triton_unavailable_reason", lambda: None)
    monkeypatch.setattr(autograd, "_interpreting", lambda: False)
    try:
        assert autograd.choose(_req()) == "cudnn"  # sm90's order: cuDNN first
        assert autograd.choose(_req(kv_heads=2)) == "triton"  # what cuDNN's cannot serve
        assert autograd.choose(_req(capability=(8, 9))) == "triton"  # elsewhere Triton first
        assert autograd.choose(_req(device_type="cpu", capability=None)) == "torch"
        autograd.set_backward_order(["flash", "cudnn", "torch"])
        assert autograd.choose(_req()) == "flash"
        assert autograd.choose(_req(head_dim=192)) == "flash"
        assert autograd.choose(_req(has_mask=True)) == "torch"
        assert autograd.choose(_req(kv_heads=2)) == "torch"
        assert autograd.choose(_req(same_len=False)) == "torch"  # flash aligns causal bottom-right
        assert autograd.choose(_req(is_causal=False, same_len=False)) == "flash"
        assert autograd.choose(_req(has_dlse=True)) == "torch"
        assert autograd.choose(_req(varlen=True)) == "torch"
        autograd.set_backward_order("cudnn")
        assert autograd.choose(_req()) == "cudnn"
        with pytest.raises(RuntimeError, match="cudnn: attn_mask"):
            autograd.choose(_req(has_mask=True))
        with pytest.raises(ValueError, match="unknown backward"):
            autograd.set_backward_order("nope")
        with autograd.backward_order("torch"):
            assert autograd.choose(_req()) == "torch"
        assert autograd.choose(_req()) == "cudnn"
    finally:
        autograd.set_backward_order(None)
    monkeypatch.setattr(autograd.ops, "triton_unavailable_reason", lambda: "no triton")
    autograd._decisions.clear()
    assert autograd.choose(_req(capability=(8, 9))) == "flash"  # the CUDA kernels' forward without Triton
    autograd._decisions.clear()


# --------------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True): forward and backward in the graph


def test_compile_fullgraph_backward(inputs, triton_standin):
    graphs = []

    def backend(gm, example_inputs):
        from functorch.compile import make_boxed_func  # noqa: PLC0415
        from torch._functorch.aot_autograd import aot_module_simplified  # noqa: PLC0415

        def keep(g, _):
            graphs.append(g)
            return make_boxed_func(g.forward)

        return aot_module_simplified(gm, example_inputs, fw_compiler=keep, bw_compiler=keep)

    def step(q, k, v, mask):
        out, lse = sa.sageattn(q, k, v, tensor_layout="NHD", is_causal=True, attn_mask=mask, return_lse=True)
        return out.float().square().sum() + lse.sum()

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    q, k, v, _ = _make(inputs, 1, 4, 2, 12, 12, 32, layout="NHD")
    mask = torch.rand(12, 12, generator=torch.Generator().manual_seed(0)) > 0.2
    mask[:, 0] = True
    compiled(q, k, v, mask).backward()
    got = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    step(q, k, v, mask).backward()
    for name, g, x in zip("qkv", got, (q, k, v)):
        assert_grad(g, x.grad, (0.99999, 1e-3), f"compiled d{name}")
    targets = {str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"}
    assert any(t.startswith("sageattention.attn_backward") for t in targets), targets
    assert any(t.startswith("sageattention.triton_attn") for t in targets), targets


# --------------------------------------------------------------------------------------------------
# The Triton kernels, under Triton's CPU interpreter

INTERPRETER_SCRIPT = ROOT / "tests" / "unit" / "triton_backward_check.py"


def test_triton_backward_under_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, str(INTERPRETER_SCRIPT)], env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "triton backward ok" in res.stdout, res.stdout[-3000:]


# --------------------------------------------------------------------------------------------------
# The fine-tuning parity script runs (smoke sizes, SDPA fallback on the CPU)


def test_finetune_parity_smoke(tmp_path):
    out = tmp_path / "parity.json"
    res = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "finetune_parity.py"), "--smoke", "--seeds", "2", "--out",
         str(out)],
        env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    import json  # noqa: PLC0415

    report = json.loads(out.read_text())
    assert math.isfinite(report["final_loss_ratio"]) and report["steps"] > 0
    assert [run["seed"] for run in report["runs"]] == [0, 1]
    assert set(report["final_loss_ratios"]) == {"sageattn", "sageattn int8"}
    assert all(set(seeds) == {"0", "1"} for seeds in report["per_seed_ratio"].values())
    for run in report["runs"]:
        for variant in ("sageattn", "sageattn int8"):
            assert run[variant]["losses"][-1] < run[variant]["losses"][0]  # it learned something
