"""Argument checks of sageattn3_blackwell, and its CPU (reference) path."""

from __future__ import annotations

import pytest
import torch
from sageattn3 import sageattn3_blackwell
from sageattn3.__main__ import main
from sageattn3.reference import attention_ref


def qkv(b=1, h=2, n=40, d=64, dtype=torch.float16, hkv=None):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, n, d, generator=gen).to(dtype)
    k, v = (torch.randn(b, hkv or h, n, d, generator=gen).to(dtype) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize(
    "change,error,words",
    [
        (lambda q, k, v: (q.numpy(), k, v), TypeError, "q must be a torch.Tensor"),
        (lambda q, k, v: (q.float(), k, v), TypeError, "q must be float16 or bfloat16"),
        (lambda q, k, v: (q, k.bfloat16(), v), TypeError, "same dtype"),
        (lambda q, k, v: (q[0], k, v), ValueError, "q must have 4 dimensions"),
        (lambda q, k, v: (q[..., :32], k[..., :32], v[..., :32]), ValueError, "head dim 32"),
        (lambda q, k, v: (q, k[:, :, :-1], v), ValueError, "v must have k's shape"),
        (lambda q, k, v: (q, k.repeat(1, 3, 1, 1)[:, :3], v.repeat(1, 3, 1, 1)[:, :3]), ValueError, "mult"),
    ],
)  # fmt: skip
def test_bad_tensors(change, error, words):
    with pytest.raises(error, match=words):
        sageattn3_blackwell(*change(*qkv()))


@pytest.mark.parametrize(
    "kwargs,error,words",
    [
        ({"tensor_layout": "BHND"}, ValueError, "tensor_layout"),
        ({"is_causal": 1}, TypeError, "is_causal"),
        ({"per_block_mean": None}, TypeError, "per_block_mean"),
        ({"return_lse": "yes"}, TypeError, "return_lse"),
        ({"sm_scale": -1.0}, ValueError, "sm_scale"),
        ({"sm_scale": "x"}, TypeError, "sm_scale"),
        ({"attn_mask": torch.ones(3, 3, dtype=torch.bool)}, ValueError, "attn_mask"),
        ({"attn_mask": torch.ones(40, 40, dtype=torch.int32)}, TypeError, "attn_mask"),
        ({"attn_mask": torch.ones(40, 40, dtype=torch.bool), "is_causal": True}, ValueError, "attn_mask"),
    ],
)  # fmt: skip
def test_bad_options(kwargs, error, words):
    with pytest.raises(error, match=words):
        sageattn3_blackwell(*qkv(), **kwargs)


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_cpu_path_matches_float64_and_leaves_inputs_alone(layout):
    q, k, v = qkv(h=4, hkv=2, n=70, dtype=torch.bfloat16)
    if layout == "NHD":
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    before = [t.clone() for t in (q, k, v)]
    out, lse = sageattn3_blackwell(q, k, v, is_causal=True, return_lse=True, tensor_layout=layout)
    assert out.dtype == q.dtype and out.shape == q.shape and lse.shape == (1, 4, 70)
    for t, b in zip((q, k, v), before):
        assert torch.equal(t, b)
    exact = attention_ref(q, k, v, is_causal=True, tensor_layout=layout)
    cos = torch.nn.functional.cosine_similarity(out.double().flatten(), exact.flatten(), dim=0).item()
    assert cos > 0.97


def test_selftest_on_cpu(capsys):
    assert main(["selftest"]) == 0
    text = capsys.readouterr().out
    assert "no GPU" in text and "FAIL" not in text


def test_backend_choice_on_cpu(monkeypatch):
    from sageattn3.core import choose_backend

    cpu = torch.device("cpu")
    assert choose_backend(cpu) == "reference"
    monkeypatch.setenv("SAGEATTN3_BACKEND", "triton")
    assert choose_backend(cpu) == "reference"  # no GPU: nothing else can run
    monkeypatch.setenv("SAGEATTN3_BACKEND", "cutlass")
    with pytest.raises(ValueError, match="SAGEATTN3_BACKEND"):
        choose_backend(cpu)
