"""``python -m sageattention run script.py [args...]`` and the environment variable SAGEATTENTION_PATCH_SDPA.

A tiny script calls F.scaled_dot_product_attention on the CPU: under the patch those calls go to torch
SDPA (no quantized kernel on the CPU), so the script's output is unchanged, and the counts and the
reason come out on stderr at exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch.nn.functional as F

from sageattention.__main__ import main
from sageattention.integrations import sdpa

ROOT = Path(__file__).resolve().parents[2]
SDPA = F.scaled_dot_product_attention

SCRIPT = textwrap.dedent(
    """
    import sys

    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 32, generator=gen).to(torch.bfloat16) for _ in range(3))
    for _ in range(3):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    print("name", __name__, "argv", sys.argv[1:])
    print("patched", type(F.scaled_dot_product_attention).__name__)
    print("sum", f"{out.float().sum().item():.6f}")
    sys.exit(int(sys.argv[1]) if sys.argv[1:] and sys.argv[1].isdigit() else 0)
    """
)


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv(sdpa.ENV_VAR, raising=False)
    sdpa.reset()
    yield
    sdpa.uninstall()
    assert F.scaled_dot_product_attention is SDPA


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "script.py"
    path.write_text(SCRIPT)
    return path


def _python(*args, env=None, cwd=None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != sdpa.ENV_VAR}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    environ.update(env or {})
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, env=environ,
                          cwd=cwd)  # fmt: skip


def test_run_leaves_the_output_alone_and_reports_the_calls(script, tmp_path):
    plain = _python(str(script), "7", "--flag", cwd=tmp_path)
    run = _python("-m", "sageattention", "run", str(script), "7", "--flag", cwd=tmp_path)
    assert plain.returncode == run.returncode == 7, run.stderr  # the script's exit status
    lines = run.stdout.splitlines()
    assert lines[0] == "name __main__ argv ['7', '--flag']" and lines[1] == "patched SageSDPA"
    assert lines[2] == plain.stdout.splitlines()[2]  # the same numbers: the calls went to torch SDPA
    assert "scaled_dot_product_attention calls: 3 (0 to sageattn, 3 to the original)" in run.stderr
    assert "3  original: cpu tensors" in run.stderr
    assert run.stderr.count("SDPAFallbackWarning") == 1  # the reason warns once


def test_run_in_process_with_options(script, capsys):
    assert main(["run", "--no-warn", str(script), "2"]) == 2
    captured = capsys.readouterr()
    assert "argv ['2']" in captured.out and "SDPAFallbackWarning" not in captured.err
    assert "3 (0 to sageattn, 3 to the original)" in captured.err and "original: cpu tensors" in captured.err
    assert F.scaled_dot_product_attention is SDPA  # uninstalled at exit


def test_run_a_module(tmp_path, monkeypatch, capsys):
    (tmp_path / "tiny_model_script.py").write_text(SCRIPT)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["run", "--no-warn", "-m", "tiny_model_script", "a", "b"]) == 0
    captured = capsys.readouterr()
    assert "name __main__ argv ['a', 'b']" in captured.out and "3 to the original" in captured.err


def test_run_without_the_patch_when_the_variable_is_0(script, monkeypatch, capsys):
    monkeypatch.setenv(sdpa.ENV_VAR, "0")
    assert main(["run", str(script)]) == 0
    captured = capsys.readouterr()
    assert "patched SageSDPA" not in captured.out
    assert "not patched (SAGEATTENTION_PATCH_SDPA=0)" in captured.err


def test_run_needs_a_script(capsys):
    with pytest.raises(SystemExit):
        main(["run"])
    assert "give a script" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_patch_from_env_installs_when_set(value):
    patch = sdpa.patch_from_env({sdpa.ENV_VAR: value}, warn=False)
    assert patch is not None and F.scaled_dot_product_attention is patch and not patch.warn
    assert sdpa.patch_from_env({sdpa.ENV_VAR: value}) is patch  # installed once


@pytest.mark.parametrize("value", [None, "0", "", "off"])
def test_patch_from_env_does_nothing_otherwise(value):
    environ = {} if value is None else {sdpa.ENV_VAR: value}
    assert sdpa.patch_from_env(environ) is None and F.scaled_dot_product_attention is SDPA


def test_patch_from_env_reads_os_environ_and_refuses_other_values(monkeypatch):
    monkeypatch.setenv(sdpa.ENV_VAR, "1")
    assert sdpa.patch_from_env() is sdpa.installed()
    monkeypatch.setenv(sdpa.ENV_VAR, "maybe")
    with pytest.raises(ValueError, match="SAGEATTENTION_PATCH_SDPA='maybe'"):
        sdpa.patch_from_env()


def test_importing_sageattention_never_patches_even_with_the_variable_set(tmp_path):
    code = (
        "import torch.nn.functional as F; f = F.scaled_dot_product_attention; import sageattention, "
        "sageattention.integrations.sdpa as s; assert F.scaled_dot_product_attention is f; "
        "p = s.patch_from_env(); assert F.scaled_dot_product_attention is p; print('ok')"
    )
    out = _python("-c", code, env={sdpa.ENV_VAR: "1"}, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
