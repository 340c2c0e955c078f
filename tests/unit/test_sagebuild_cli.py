"""The ``python -m sagebuild`` command line: plan output shapes, errors without tracebacks, docs current."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sagebuild import cli, docs
from sagebuild.matrix import REPO_ROOT, load


def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_github_matrix_shape(capsys):
    code, out, _ = run_cli(capsys, "plan", "--profile", "stable", "--platform", "linux", "--format", "github")
    assert code == 0
    payload = json.loads(out)
    assert list(payload) == ["include"] and len(payload["include"]) == 3
    first = payload["include"][0]
    for key in (
        "id",
        "package",
        "platform",
        "runner",
        "torch",
        "cuda",
        "python",
        "archs",
        "build_tag",
        "wheel_tag",
        "wheel",
    ):
        assert key in first
    assert first["id"] == "linux-sageattention-pytorch26-cu126-python312"
    assert first["runner"] == "ubuntu-24.04" and first["archs"] == "8.0;8.6;8.9;9.0a"
    assert first["wheel"] == "sageattention-2.2.0-260.126-cp312-cp312-linux_x86_64.whl"
    assert "\n" not in out.strip()  # one line, for $GITHUB_OUTPUT


def test_plan_json_and_text(capsys):
    code, out, _ = run_cli(capsys, "plan", "--profile", "sage2-all", "--format", "json")
    payload = json.loads(out)
    assert code == 0 and payload["count"] == 20 and payload["profile"] == "sage2-all"
    code, out, _ = run_cli(capsys, "plan", "--profile", "sage3-all", "--platform", "windows")
    assert "windows-sageattn3-pytorch29-cu128-python312" in out
    assert "sageattn3-1.0.0+cu128torch2.9.0-cp312-cp312-win_amd64.whl" in out
    code, out, _ = run_cli(capsys, "plan", "--profile", "sage3-all", "--package", "sageattention")
    assert code == 0 and "0 builds" in out


def test_unknown_profile_lists_valid_ones(capsys):
    code, out, err = run_cli(capsys, "plan", "--profile", "nightly")
    assert code == 2 and out == ""
    assert "unknown profile 'nightly'; valid profiles: default, abi3-release, stable, pytorch26" in err
    assert "Traceback" not in err


def test_module_entry_point_exit_code():
    proc = subprocess.run(
        [sys.executable, "-m", "sagebuild", "plan", "--profile", "nope"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "valid profiles" in proc.stderr and "Traceback" not in proc.stderr


def test_invalid_build_request_is_refused_before_any_work(capsys):
    code, _, err = run_cli(capsys, "build", "--torch", "2.8.0", "--cuda", "13.0", "--python", "3.12")
    assert code == 2 and "has no CUDA 13.0 build; it ships CUDA 12.6, 12.8, 12.9" in err
    code, _, err = run_cli(
        capsys, "build", "--target", "linux-sageattention-pytorch28-cu129-python312", "--archs", "7.0"
    )
    assert code == 2 and "7.0 is not a sageattention arch" in err
    code, _, err = run_cli(capsys, "build", "--cpu", "--torch", "2.8.0")
    assert code == 2 and "pure-Python wheel" in err


def test_validate(capsys):
    code, out, _ = run_cli(capsys, "validate")
    assert code == 0 and "valid" in out


def test_build_matrix_md_is_current():
    """BUILD_MATRIX.md is generated: if this fails, run `python -m sagebuild docs` and commit it."""
    current = (REPO_ROOT / docs.OUTPUT).read_text(encoding="utf-8")
    assert current == docs.render(load()), "BUILD_MATRIX.md is stale: run `python -m sagebuild docs`"


def test_docs_check(tmp_path, capsys):
    target = tmp_path / "BUILD_MATRIX.md"
    assert cli.main(["docs", "--output", str(target)]) == 0
    assert cli.main(["docs", "--check", "--output", str(target)]) == 0
    target.write_text(target.read_text() + "edited by hand\n")
    assert cli.main(["docs", "--check", "--output", str(target)]) == 1
    assert "out of date" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["plan", "build", "verify", "index", "which", "docs", "validate"])
def test_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    assert info.value.code == 0
    assert "usage: python -m sagebuild" in capsys.readouterr().out
