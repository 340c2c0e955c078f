"""sageattn3 on a GPU against the references (marker gpu; skipped without CUDA).

Run: python -m pytest sageattention3_blackwell/tests/gpu -m gpu -q -s   (-s shows the accuracy figures)

Two implementations, each tested where it can run:
* triton: the Triton kernels (every GPU of sm80 and newer);
* native: the compiled kernels of sageattn3._C when the install holds code for this GPU: sm_120a on
  compute capability 12.0, sm_100a on 10.0, and on an H100/H200 the sm_90a test build (the sm_100a
  attention code and the quantization kernels, built with TORCH_CUDA_ARCH_LIST="9.0a").
"""

from __future__ import annotations

import pytest
import torch
from sageattn3 import ops, reference, sageattn3_blackwell
from sageattn3.triton import quant

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
DEV = "cuda"
#: Kernel against sage3_ref (same arithmetic: float32 addition order in the MMAs, hardware exp2, the
#: bf16/fp16 output rounding differ). The Triton bound is the one it has always been held to.
TIGHT = {"triton": 0.9995, "native": 0.9999}
#: sage3_ref's own cosine against float64 at b=1 h=8 n=4096 d=128 (bf16 inputs, seed 0, computed on a
#: CPU), non-causal / causal: randn 0.98225 / 0.98452, outlier 0.96255 / 0.96974. The kernels are held
#: to these floors (the figures less about 0.002); the issue's 0.995 is beyond the NVFP4 arithmetic
#: itself and is tested, as an expected failure, in test_issue_bound_0995.
FLOOR = {"randn": 0.980, "outlier": 0.960}


def cosine(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


def rel_l1(a, b):
    a, b = a.double(), b.double()
    return float((a - b).abs().sum() / b.abs().sum())


def inputs(b, hq, hkv, nq, nk, d, dtype=torch.bfloat16, kind="randn", seed=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    q = torch.randn(b, hq, nq, d, generator=gen, device=DEV)
    k = torch.randn(b, hkv, nk, d, generator=gen, device=DEV)
    v = torch.randn(b, hkv, nk, d, generator=gen, device=DEV)
    if kind == "outlier":
        k = k + 8.0 * torch.randn(1, 1, 1, d, generator=gen, device=DEV)
        v[..., :4] *= 10.0
        q = q * 2.0
    return q.to(dtype), k.to(dtype), v.to(dtype)


def native_reason() -> str | None:
    return ops.unavailable_reason(torch.device(DEV))


@pytest.fixture(params=["triton", "native"])
def backend(request, monkeypatch):
    """Forces sageattn3_blackwell onto one implementation (SAGEATTN3_BACKEND)."""
    if request.param == "native" and native_reason():
        pytest.skip(f"native kernels do not run here: {native_reason()}")
    monkeypatch.setenv("SAGEATTN3_BACKEND", request.param)
    return request.param


class NativeQuant:
    """The compiled quantization ops with the Triton module's signatures."""

    @staticmethod
    def quantize_q(x, per_block_mean):
        return torch.ops.sageattn3.quant_nvfp4_rows(x, 128, 2 if per_block_mean else 0, None)

    @staticmethod
    def quantize_k(x, block):
        mean = torch.mean(x, dim=2, dtype=torch.float32)
        return (*torch.ops.sageattn3.quant_nvfp4_rows(x, block, 1, mean)[:3], mean)

    @staticmethod
    def quantize_vt(x, block):
        return torch.ops.sageattn3.quant_nvfp4_vt(x, block)


@pytest.mark.parametrize("impl", ["triton", "native"])
@pytest.mark.parametrize("n", [1, 17, 113, 1000, 4095])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_quantization_bit_exact(impl, n, d, dtype):
    if impl == "native" and native_reason():
        pytest.skip(f"native kernels do not run here: {native_reason()}")
    kernels = quant if impl == "triton" else NativeQuant
    q, k, v = inputs(2, 3, 3, n, n, d, dtype, kind="outlier", seed=n)
    qc, qs, qg, qm = kernels.quantize_q(q, True)
    ref = reference.quantize_q_ref(q, q_mean=qm)
    assert torch.allclose(qm, reference.smooth_q_ref(q)[0], rtol=1e-5, atol=1e-6)
    assert torch.equal(qc[:, :, :n], ref.codes) and torch.equal(qc[:, :, n:], torch.zeros_like(qc[:, :, n:]))
    assert torch.equal(qs[:, :, :n], ref.scales.view(torch.uint8)) and torch.equal(qg, ref.block_scale)
    qc, qs, qg, _ = kernels.quantize_q(q, False)
    ref = reference.quantize_q_ref(q, per_block_mean=False)
    assert torch.equal(qc[:, :, :n], ref.codes) and torch.equal(qs[:, :, :n], ref.scales.view(torch.uint8))
    kc, ks, kg, km = kernels.quantize_k(k, 128)
    assert torch.allclose(km, k.float().mean(dim=2), rtol=1e-5, atol=1e-6)
    ref = reference.quantize_k_ref(k, k_mean=km)
    assert torch.equal(kc[:, :, :n], ref.codes) and torch.equal(ks[:, :, :n], ref.scales.view(torch.uint8))
    assert torch.equal(kg, ref.block_scale)
    vc, vs, vg = kernels.quantize_vt(v, 128)
    ref = reference.quantize_v_ref(v)
    assert (
        torch.equal(vc, ref.codes)
        and torch.equal(vs, ref.scales.view(torch.uint8))
        and torch.equal(vg, ref.block_scale)
    )


@pytest.mark.parametrize("nq,nk", [(1, 1), (17, 17), (113, 300), (1000, 1000), (4095, 4095), (300, 113)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2)])
def test_attention_vs_simulated_reference(backend, nq, nk, causal, hq, hkv):
    q, k, v = inputs(1, hq, hkv, nq, nk, 128, seed=nq + nk)
    out, lse = sageattn3_blackwell(q, k, v, is_causal=causal, return_lse=True)
    sim, lse_sim = reference.sage3_ref(q, k, v, is_causal=causal, return_lse=True)
    assert not torch.isnan(out).any()
    assert cosine(out, sim) > TIGHT[backend]
    assert (out.float() - sim).abs().max().item() < 0.05 * sim.abs().max().item() + 1e-3
    finite = torch.isfinite(lse_sim)
    assert torch.equal(finite, torch.isfinite(lse))
    assert torch.allclose(lse[finite], lse_sim[finite], atol=2e-3, rtol=1e-4)


@pytest.mark.parametrize("d", [64, 128])
def test_head_dims_and_per_block_mean_off(backend, d):
    q, k, v = inputs(2, 4, 2, 333, 257, d, dtype=torch.float16, kind="outlier", seed=d)
    for per_block_mean in (True, False):
        out = sageattn3_blackwell(q, k, v, per_block_mean=per_block_mean, sm_scale=0.2)
        sim = reference.sage3_ref(q, k, v, per_block_mean=per_block_mean, sm_scale=0.2)
        assert cosine(out, sim) > TIGHT[backend]


def _protocol(backend, kind, causal):
    q, k, v = inputs(1, 8, 8, 4096, 4096, 128, kind=kind)
    out = sageattn3_blackwell(q, k, v, is_causal=causal)
    exact = reference.attention_ref(q, k, v, is_causal=causal)
    sim = reference.sage3_ref(q, k, v, is_causal=causal)
    return out, exact, sim, (q, k, v)


def _sageattention_fp8(q, k, v, causal):
    """sageattention's sageattn on the same inputs (its FP8 P·V path on Hopper), when importable."""
    try:
        from sageattention import sageattn
    except ImportError:
        return None
    return sageattn(q, k, v, is_causal=causal)


@pytest.mark.parametrize("kind", ["randn", "outlier"])
@pytest.mark.parametrize("causal", [False, True])
def test_accuracy_protocol(backend, kind, causal):
    """b=1 h=8 n=4096 d=128 bf16 against float64: the kernel matches sage3_ref tightly, and reaches at
    least the floor the NVFP4 arithmetic itself allows (FLOOR; figures printed, with sageattention's)."""
    out, exact, sim, (q, k, v) = _protocol(backend, kind, causal)
    c_out, c_sim, c_tight = cosine(out, exact), cosine(sim, exact), cosine(out, sim)
    line = (
        f"[{backend}] {kind} causal={causal}: vs float64 cosine {c_out:.5f} rel L1 {rel_l1(out, exact):.4f}; "
        f"sage3_ref vs float64 {c_sim:.5f}; kernel vs sage3_ref {c_tight:.6f}"
    )
    other = _sageattention_fp8(q, k, v, causal)
    if other is not None:
        line += f"; sageattention sageattn vs float64 {cosine(other, exact):.5f}"
        line += f" rel L1 {rel_l1(other, exact):.4f}"
    print(f"\n{line}")
    assert c_tight > TIGHT[backend]
    assert c_out >= FLOOR[kind] and c_out >= c_sim - 1e-3


@pytest.mark.xfail(
    strict=True,
    reason="the issue asks cosine >= 0.995 against float64, but the NVFP4 arithmetic itself (sage3_ref) "
    "reaches 0.982 on randn inputs at this shape: Q/K, P and V quantization alone give 0.991, 0.996 and "
    "0.996 (docs/sageattn3.md)",
)
def test_issue_bound_0995(backend):
    out, exact, _, _ = _protocol(backend, "randn", False)
    assert cosine(out, exact) >= 0.995


def test_masks_layout_and_inputs_untouched(backend):
    q, k, v = inputs(2, 4, 2, 200, 150, 64, dtype=torch.float16)
    q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # NHD
    before = [t.clone() for t in (q, k, v)]
    gen = torch.Generator(device=DEV).manual_seed(9)
    mask = torch.rand(2, 1, 200, 150, generator=gen, device=DEV) > 0.2
    mask[:, :, 3] = False  # a row with no visible key: 0
    out = sageattn3_blackwell(q, k, v, attn_mask=mask, tensor_layout="NHD")
    sim = reference.sage3_ref(q, k, v, attn_mask=mask, tensor_layout="NHD")
    assert cosine(out, sim) > TIGHT[backend] and not out[:, 3].any()
    add = torch.randn(200, 150, generator=gen, device=DEV).half()
    out = sageattn3_blackwell(q, k, v, attn_mask=add, tensor_layout="NHD")
    assert cosine(out, reference.sage3_ref(q, k, v, attn_mask=add, tensor_layout="NHD")) > TIGHT[backend]
    for t, b in zip((q, k, v), before):
        assert torch.equal(t, b)


def test_native_is_the_default_on_blackwell():
    cc = torch.cuda.get_device_capability()
    if cc not in ((10, 0), (12, 0)):
        pytest.skip(f"sm_{cc[0]}{cc[1]} is not a Blackwell target of the wheel")
    from sageattn3.core import choose_backend

    expected = "native" if native_reason() is None else "triton"
    assert choose_backend(torch.device(DEV)) == expected


def test_selftest_passes():
    from sageattn3.__main__ import main

    assert main(["selftest"]) == 0
