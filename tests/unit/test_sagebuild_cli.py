"""The ``python -m sagebuild`` command line: plan output shapes, errors without tracebacks, docs current."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sagebuild import cli, docs
from sagebuild.matrix import REPO_ROOT, load


def matrix_copy(folder: Path, data: dict) -> Path:
    """A matrix file with the given contents in ``folder``, next to copies of the files it reads the
    package versions from."""
    for package in data["packages"].values():
        source = REPO_ROOT / package["version_from"]
        if source.is_file():
            (folder / package["version_from"]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, folder / package["version_from"])
    path = folder / "build-matrix.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


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
    assert code == 0 and payload["count"] == 30 and payload["profile"] == "sage2-all"  # 10 per platform
    code, out, _ = run_cli(capsys, "plan", "--profile", "sage3-all", "--platform", "windows")
    assert "windows-sageattn3-pytorch29-cu128-python312" in out
    assert "sageattn3-1.0.0+cu128torch2.9.0-cp312-cp312-win_amd64.whl" in out
    code, out, _ = run_cli(
        capsys, "plan", "--profile", "sage3-all", "--package", "sageattention", "--allow-empty"
    )
    assert code == 0 and "0 builds" in out


def test_a_plan_that_selects_nothing_is_an_error_that_says_why(capsys):
    code, out, err = run_cli(capsys, "plan", "--profile", "stable", "--package", "sageattn3")
    assert code == 2 and out == "" and "Traceback" not in err
    assert "profile stable selects no builds for sageattn3" in err
    # which filter removed everything, and which packages the profile's set is for
    assert "profile stable builds sageattention (its set sage2-release is for sageattention)" in err
    assert "the profiles that build sageattn3: sage3-all" in err
    code, out, err = run_cli(capsys, "plan", "--profile", "ci-build", "--platform", "windows")
    assert code == 2 and "profile ci-build builds only for linux" in err and "not windows" in err
    for fmt in ("text", "json", "github"):
        code, out, err = run_cli(
            capsys, "plan", "--profile", "ci-build", "--system", "Windows", "--format", fmt
        )
        assert code == 2 and "selects no builds" in err and out == ""
    code, out, _ = run_cli(
        capsys, "plan", "--profile", "ci-build", "--system", "Windows", "--allow-empty", "--format", "github"
    )
    assert code == 0 and json.loads(out) == {"include": []}


def test_build_profile_that_selects_nothing_says_why(capsys, monkeypatch):
    monkeypatch.setattr(cli.envs, "current_platform", lambda wheel_platforms: "linux")
    code, _, err = run_cli(capsys, "build", "--profile", "stable", "--package", "sageattn3")
    assert code == 2 and "the profiles that build sageattn3: sage3-all" in err


def test_plan_by_system(capsys):
    code, out, _ = run_cli(capsys, "plan", "--profile", "stable", "--system", "Linux", "--format", "github")
    ids = [e["id"] for e in json.loads(out)["include"]]
    matrix = load()
    linux = [t.id for p in ("linux", "linux-aarch64") for t in matrix.profile_targets("stable", platform=p)]
    assert code == 0 and ids == linux  # every platform of the system, in the matrix's order
    code, out, _ = run_cli(capsys, "plan", "--profile", "stable", "--platform", "linux-aarch64")
    assert code == 0 and "linux-aarch64-sageattention-pytorch28-cu129-python312" in out
    assert "sageattention-2.2.0-280.129-cp312-cp312-linux_aarch64.whl" in out
    code, _, err = run_cli(capsys, "plan", "--profile", "stable", "--system", "Plan9")
    assert code == 2 and "unknown system 'Plan9'" in err and "Linux, Windows" in err
    code, _, err = run_cli(capsys, "plan", "--profile", "stable", "--platform", "macos")
    assert (
        code == 2 and "unknown platform 'macos'; the matrix's platforms: linux, windows, linux-aarch64" in err
    )


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


def walk_parsers(parser, path=()):
    """(command path, parser) for the parser and every subcommand under it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk_parsers(sub, (*path, name))


def test_every_option_and_subcommand_has_help():
    parser = cli.make_parser()
    missing = []
    for path, sub in walk_parsers(parser):
        if path and not (sub.description or "").strip():
            missing.append(f"{' '.join(path)}: no description")
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {c.dest: c.help for c in action._choices_actions}
                missing += [
                    f"{' '.join((*path, n))}: no help line" for n in action.choices if not helps.get(n)
                ]
                continue
            if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
                missing.append(
                    f"{' '.join(path) or 'sagebuild'} {'/'.join(action.option_strings) or action.dest}"
                )
    assert not missing, "without help text:\n  " + "\n  ".join(missing)


def test_profile_and_platform_help_come_from_the_matrix(capsys, tmp_path):
    with pytest.raises(SystemExit):
        cli.main(["plan", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for name in load().profiles:
        assert name in out
    assert "linux (linux_x86_64), windows (win_amd64)" in out
    # the matrix given by --matrix, not the checkout's
    data = yaml.safe_load((REPO_ROOT / "build-matrix.yaml").read_text(encoding="utf-8"))
    data["profiles"]["nightly-test"] = {"description": "x", "set": "sage2-release", "torch": ["2.8.0"]}
    other = matrix_copy(tmp_path, data)
    with pytest.raises(SystemExit):
        cli.main(["--matrix", str(other), "plan", "--help"])
    assert "nightly-test" in capsys.readouterr().out


def test_help_of_validate_and_ci_env(capsys):
    for command in ("validate", "ci-env"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        usage, _, rest = capsys.readouterr().out.partition("\n\n")
        assert rest.split("\n", 1)[0].strip() and not rest.startswith("options:"), command


def test_a_closed_pipe_ends_plan_quietly():
    """`plan ... | head`: the reader goes away first; sagebuild stops without a traceback."""
    for args in (["plan", "--profile", "sage2-current"], ["plan", "--help"]):
        proc = subprocess.Popen(
            [sys.executable, "-m", "sagebuild", *args],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        proc.stdout.close()  # before sagebuild writes anything (it loads the matrix first)
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=60)
        assert err == "", err
        # the help text fits the pipe's buffer (argparse ignores the failed write): 0 is quiet too
        assert code == cli.BROKEN_PIPE_EXIT or (code == 0 and "--help" in args)
    bash = shutil.which("bash")
    if bash:
        proc = subprocess.run(
            [
                bash,
                "-o",
                "pipefail",
                "-c",
                f'"{sys.executable}" -m sagebuild plan --profile sage2-current | head -1',
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.stdout.startswith("profile sage2-current") and "Error" not in proc.stderr


@pytest.mark.parametrize(
    "launcher",
    [["sagebuild"], ["bin/sagebuild"]],
    ids=["the sagebuild folder", "bin/sagebuild"],
)
def test_runs_from_any_directory(tmp_path, launcher):
    """Not only from the checkout's root: from a temporary directory (no PYTHONPATH), the matrix, its
    generated files and the sources are still the checkout's."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = [sys.executable, str(REPO_ROOT / launcher[0])]

    def run(*args):
        return subprocess.run(
            [*cmd, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )

    proc = run("validate")
    assert proc.returncode == 0, proc.stderr
    assert str(REPO_ROOT / "build-matrix.yaml") in proc.stdout
    proc = run("plan", "--profile", "default", "--format", "json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["count"] == 3  # one per platform
    proc = run("docs", "--check")
    assert proc.returncode == 0 and str(REPO_ROOT / docs.OUTPUT) in proc.stdout + proc.stderr
    assert run("plan", "--profile", "nope").returncode == 2
    assert list(tmp_path.iterdir()) == []  # nothing written into the working directory


@pytest.fixture
def no_installs(monkeypatch):
    """Fails the test when a build gets as far as making an environment or running pip or a tool."""
    from sagebuild import build as sb
    from sagebuild import envs

    def refuse(*args, **kwargs):
        raise AssertionError(f"installed or ran something: {args[:2]}")

    for name in ("create_venv", "pip", "run", "find_python"):
        monkeypatch.setattr(envs, name, refuse)
    monkeypatch.setattr(sb, "prepare_toolkit", refuse)
    monkeypatch.setattr(envs, "current_platform", lambda wheel_platforms: "linux")
    for name in ("SAGEBUILD_TORCH_INDEX", *sb.PIP_INDEX_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    return sb


def test_a_build_that_needs_a_torch_index_stops_before_installing(no_installs, capsys, tmp_path):
    sb = no_installs
    # torch 2.8.0's CUDA 12.9 build is not what the plain index serves on Linux (12.8: registry_cuda)
    target = "linux-sageattention-pytorch28-cu129-python312"
    code, _, err = run_cli(capsys, "build", "--target", target, "--cache-dir", str(tmp_path))
    assert code == 1 and "Traceback" not in err
    assert "needs torch 2.8.0 built for CUDA 12.9" in err and "serves its CUDA 12.8 build on linux" in err
    assert "Set SAGEBUILD_TORCH_INDEX" in err and "cu129 here" in err and "Nothing was installed" in err
    assert list(tmp_path.iterdir()) == []
    # a whole profile is checked before its first build
    code, _, err = run_cli(capsys, "build", "--profile", "stable", "--cache-dir", str(tmp_path))
    assert code == 1 and "linux-sageattention-pytorch26-cu126-python312 needs torch 2.6.0" in err
    # what needs no index, or has one, passes the check
    matrix = load()
    served = matrix.find_target("linux-sageattention-pytorch2141-cu130-python312")
    sb.check_torch_source(matrix, served, sb.BuildOptions(target=served), environ={})
    needs = matrix.find_target(target)
    sb.check_torch_source(matrix, needs, sb.BuildOptions(target=needs, index_url="file:///idx"), environ={})
    sb.check_torch_source(matrix, needs, sb.BuildOptions(target=needs, use_current_env=True), environ={})
    sb.check_torch_source(matrix, needs, sb.BuildOptions(target=needs), environ={"PIP_INDEX_URL": "x"})
    windows = matrix.find_target("windows-sageattention-pytorch2141-cu130-python312")
    with pytest.raises(sb.SagebuildError, match="serves only its CPU build on windows"):
        sb.check_torch_source(matrix, windows, sb.BuildOptions(target=windows), environ={})


def test_the_torch_index_variable_satisfies_the_check(no_installs, monkeypatch):
    sb = no_installs
    matrix = load()
    needs = matrix.find_target("linux-sageattention-pytorch28-cu129-python312")
    monkeypatch.setenv("SAGEBUILD_TORCH_INDEX", "file:///srv/torch/{cuda_tag}")
    sb.check_torch_source(matrix, needs, sb.BuildOptions(target=needs))
