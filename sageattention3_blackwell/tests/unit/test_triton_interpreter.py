"""The Triton kernels run under Triton's CPU interpreter and agree with the reference: the
quantization bit for bit, the attention to float32 rounding. (The interpreter runs the same
kernel code as the GPU, with numpy arithmetic; it does not check compiled code or performance.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

SCRIPT = r"""
import numpy as np
import torch
import triton.runtime.interpreter as interp

_patch = interp._patch_lang_tensor


def _patched(tensor, scope):
    _patch(tensor, scope)
    # numpy 2 refuses int() of a 1-element 1-D array, which the interpreter uses for loop bounds.
    scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))


interp._patch_lang_tensor = _patched

from sageattn3 import reference as R
from sageattn3.core import _grouped_matmul
from sageattn3.triton import attention, quant

gen = torch.Generator().manual_seed(0)
q = (torch.randn(1, 2, 70, 64, generator=gen) * 2 + 1).bfloat16()
k = (torch.randn(1, 1, 140, 64, generator=gen) + 3).bfloat16()
v = torch.randn(1, 1, 140, 64, generator=gen).bfloat16()
qq = quant.quantize_q(q, True)
ref = R.quantize_q_ref(q, q_mean=qq[3])
assert torch.equal(qq[0][:, :, :70], ref.codes)
assert torch.equal(qq[1][:, :, :70], ref.scales.view(torch.uint8))
assert torch.equal(qq[2], ref.block_scale)
kq = quant.quantize_k(k, 128)
ref = R.quantize_k_ref(k, k_mean=kq[3])
assert torch.equal(kq[0][:, :, :140], ref.codes)
assert torch.equal(kq[1][:, :, :140], ref.scales.view(torch.uint8))
vq = quant.quantize_vt(v, 128)
ref = R.quantize_v_ref(v)
assert torch.equal(vq[0], ref.codes) and torch.equal(vq[1], ref.scales.view(torch.uint8))
assert torch.equal(vq[2], ref.block_scale)
ks = (k.double() - kq[3].double().unsqueeze(2)).transpose(-1, -2)
corr = _grouped_matmul(qq[3].double(), ks).float().contiguous()
out = torch.empty_like(q)
attention.attention_fp4(qq, kq, vq, nq=70, nk=140, corr=corr, attn_mask=None, is_causal=True,
                        sm_scale=0.125, out=out, return_lse=False, block_n=128)
sim = R.sage3_ref(q, k, v, is_causal=True, sm_scale=0.125)
cos = torch.nn.functional.cosine_similarity(out.double().flatten(), sim.double().flatten(), dim=0).item()
assert cos > 0.99999, cos
print("interpreter ok", cos)
"""


def test_kernels_under_interpreter():
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(root))
    res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "interpreter ok" in res.stdout
