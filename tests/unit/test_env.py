"""`python -m sageattention env`: runs anywhere (also with no GPU), as text or JSON, and says why
things are missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from sageattention.__main__ import collect, main

ROOT = Path(__file__).resolve().parents[2]


def test_module_entry_point_runs():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run(
        [sys.executable, "-m", "sageattention", "env"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    for needle in ("sageattention", "python", "torch", "triton", "_qattn_sm80", "_qattn_sm89", "_qattn_sm90",
                   "sageattn on", "dispatch table"):  # fmt: skip
        assert needle in result.stdout, needle


def test_text_report(capsys):
    assert main(["env"]) == 0
    text = capsys.readouterr().out
    assert f"torch             {torch.__version__}" in text
    assert "bfloat16, head_dim 128" in text
    if not torch.cuda.is_available():
        assert "GPUs              none visible to torch" in text
        assert "sageattn on cpu" in text and ": sdpa - " in text
        assert "because: device cpu is not a CUDA GPU" in text


def test_json_report(capsys):
    assert main(["env", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert set(info) >= {"sageattention", "python", "platform", "torch", "triton", "triton_kernels",
                         "compiled_extensions", "devices", "sageattn"}  # fmt: skip
    assert info["torch"]["version"] == torch.__version__
    assert info["triton"]["version"] or info["triton"]["reason"]
    assert info["triton_kernels"]["importable"] or info["triton_kernels"]["reason"]
    for name, ext in info["compiled_extensions"].items():
        assert ext["present"] or ext["reason"], name
    choice = info["sageattn"]
    assert choice["backend"] in {"cuda_sm90", "cuda_sm89", "cuda_sm80", "triton_fp8", "triton_fp16", "sdpa"}
    assert len(choice["table"]) >= 2 and choice["dtype"] == "bfloat16" and choice["head_dim"] == 128


def test_missing_triton_is_explained(monkeypatch):
    from sageattention import ops

    monkeypatch.setattr(ops, "_triton", [None, "ModuleNotFoundError: No module named 'triton'"])
    info = collect()
    assert not info["triton_kernels"]["importable"]
    assert "No module named 'triton'" in info["triton_kernels"]["reason"]
