"""Environment helpers: Windows paths, index templates, parallelism, progress output, staging."""

from __future__ import annotations

import io
import re
from pathlib import Path, PurePosixPath, PureWindowsPath

import pytest

from sagebuild import envs
from sagebuild.build import auto_target, stage_sources
from sagebuild.errors import SagebuildError
from sagebuild.matrix import REPO_ROOT, load

GIB = 1024**3


def test_venv_layout_per_platform():
    assert envs.venv_python(r"C:\build\env", windows=True) == PureWindowsPath(
        r"C:\build\env\Scripts\python.exe"
    )
    assert envs.venv_python("/build/env", windows=False) == PurePosixPath("/build/env/bin/python")
    assert envs.exe_name("nvcc", windows=True) == "nvcc.exe"
    assert envs.exe_name("nvcc.exe", windows=True) == "nvcc.exe"
    assert envs.exe_name("nvcc", windows=False) == "nvcc"


def test_windows_paths_and_uris():
    assert envs.file_uri(r"C:\wheels\index\simple", windows=True) == "file:///C:/wheels/index/simple"
    assert envs.file_uri(PureWindowsPath(r"D:\a b\simple"), windows=True) == "file:///D:/a%20b/simple"
    assert envs.file_uri("/srv/wheels/simple", windows=False) == "file:///srv/wheels/simple"
    assert envs.pure_path(r"C:\x\y", windows=True).parts == ("C:\\", "x", "y")


def test_torch_index_template(monkeypatch):
    monkeypatch.delenv("SAGEBUILD_TORCH_INDEX", raising=False)
    assert envs.torch_index("cu128") is None  # pip's own configured index
    monkeypatch.setenv("SAGEBUILD_TORCH_INDEX", "https://mirror.example/whl/{cuda_tag}")
    assert envs.torch_index("cu128") == "https://mirror.example/whl/cu128"
    assert envs.torch_index("cu128", explicit="file:///idx") == "file:///idx"
    monkeypatch.setenv("SAGEBUILD_TORCH_INDEX", "https://mirror.example/{cuda_version}")
    with pytest.raises(SagebuildError, match="unknown placeholder"):
        envs.torch_index("cu128")


@pytest.mark.parametrize(
    "cores,memory,archs,environ,expected",
    [
        (2, 24 * GIB, 1, {}, (2, 1)),  # CI: 2 cores, plenty of memory
        (16, 12 * GIB, 5, {}, (3, 1)),  # memory-bound: 12 GiB -> 3 jobs, no memory left for more threads
        (16, 64 * GIB, 5, {}, (16, 1)),  # cores-bound: a job per core, no core left for threads
        (4, 64 * GIB, 5, {"MAX_JOBS": "1"}, (1, 4)),  # one job: nvcc threads use the other cores
        (2, 2 * GIB, 5, {}, (1, 1)),  # little memory: one job, one thread
        (64, 512 * GIB, 5, {}, (64, 1)),
        (8, 64 * GIB, 5, {"MAX_JOBS": "2", "NVCC_THREADS": "4"}, (2, 4)),  # the environment wins
        (8, 64 * GIB, 5, {"MAX_JOBS": "junk"}, (8, 1)),
    ],
)
def test_parallelism(cores, memory, archs, environ, expected):
    assert envs.default_parallelism(archs, cores=cores, memory=memory, environ=environ) == expected


def test_progress_output():
    stream = io.StringIO()
    progress = envs.Progress(stream)
    with progress.step("compile"):
        progress.detail("detail line")
    lines = stream.getvalue().splitlines()
    assert re.match(r"^\[\d\d:\d\d:\d\d \+0:00\] == compile$", lines[0])
    assert lines[1].strip() == "detail line"
    assert re.match(r"^\[\d\d:\d\d:\d\d \+0:00\]    compile: done in \d+\.\ds$", lines[2])
    with pytest.raises(RuntimeError), progress.step("fails"):
        raise RuntimeError("boom")
    assert "!! fails: failed after" in stream.getvalue()


def test_find_python_explains_what_to_do(tmp_path):
    with pytest.raises(SagebuildError, match=r"no Python 3\.99 interpreter found.*--python-exe"):
        envs.find_python("3.99")
    with pytest.raises(SagebuildError, match="does not run"):
        envs.find_python("3.11", explicit=tmp_path / "missing-python")


def test_toolkit_detection_rejects_wrapper_folders(tmp_path):
    wrapper = tmp_path / "usr-local"
    (wrapper / "bin").mkdir(parents=True)
    (wrapper / "bin" / "nvcc").write_text("#!/bin/sh\n")
    assert not envs.is_toolkit(wrapper)  # no CUDA headers: a wrapper script's folder
    (wrapper / "include").mkdir()
    (wrapper / "include" / "cuda_runtime.h").write_text("")
    assert envs.is_toolkit(wrapper)


def test_pip_toolkit_layout_fixes(tmp_path):
    home = tmp_path / "nvidia" / "cu13"
    (home / "lib").mkdir(parents=True)
    (home / "lib" / "libcudart.so.13").write_text("")
    envs.finish_pip_toolkit(home)
    if not envs.is_windows():
        assert (home / "lib64").resolve() == (home / "lib").resolve()
        assert (home / "lib" / "libcudart.so").resolve().name == "libcudart.so.13"


def test_staging_copies_only_what_the_build_needs(tmp_path):
    matrix = load()
    progress = envs.Progress(io.StringIO())
    staged = stage_sources(matrix, matrix.package("sageattention"), tmp_path, progress)
    assert (staged / "setup.py").is_file() and (staged / "build-matrix.yaml").is_file()
    assert (staged / "sagebuild" / "matrix.py").is_file()
    assert not (staged / "tests").exists() and not (staged / ".git").exists()
    assert not list(staged.rglob("__pycache__"))
    staged3 = stage_sources(matrix, matrix.package("sageattn3"), tmp_path / "s3", progress)
    assert (staged3 / "setup.py").is_file() and (staged3 / "sageattn3" / "__init__.py").is_file()
    assert not (staged3 / "tests").exists()
    # the files sageattn3 takes from the repository, at their repository paths next to its sources
    assert staged3 == tmp_path / "s3" / "src" / "sageattention3_blackwell"
    for name in matrix.package("sageattn3").shared_files:
        assert (staged3.parent / name).read_bytes() == (matrix.root / name).read_bytes()


def test_the_machine_is_the_platform_of_its_wheel_tag(monkeypatch):
    """linux_x86_64 -> linux, linux_aarch64 -> linux-aarch64, win_amd64 -> windows: by the matrix's
    wheel tags, so a new platform of the matrix is found without code."""
    wheel_platforms = load().wheel_platforms()
    for machine, platform in [("linux-x86_64", "linux"), ("linux-aarch64", "linux-aarch64"),
                              ("win-amd64", "windows"), ("macosx-14.0-arm64", None),
                              ("linux-ppc64le", None)]:  # fmt: skip
        monkeypatch.setattr(envs.sysconfig, "get_platform", lambda m=machine: m)
        assert envs.current_platform(wheel_platforms) == platform
    assert envs.machine_platform_tag() == "linux_ppc64le"


def test_auto_target_uses_the_machine(monkeypatch):
    matrix = load()
    monkeypatch.setattr(envs, "current_platform", lambda wheel_platforms: "linux")
    monkeypatch.setattr(envs, "detect_cuda_home", lambda: Path("/opt/cuda"))
    monkeypatch.setattr(envs, "nvcc_version", lambda home: ("13.0", "13.0.88"))
    target = auto_target(matrix, "sageattention", None, None, None, python="3.11")
    assert (target.torch, target.cuda, target.python) == ("2.14.1", "13.0", "3.11")
    target = auto_target(matrix, "sageattention", None, None, "9.0a", torch="2.8.0", python="3.12")
    assert (target.cuda, target.archs) == ("12.8", ("9.0a",))  # the CUDA the plain index serves
    monkeypatch.setattr(envs, "detect_cuda_home", lambda: None)
    assert auto_target(matrix, "sageattention", None, None, None, python="3.11") is None  # pure wheel
    # an aarch64 machine with nvcc 12.8: the newest torch with an aarch64 CUDA 12.8 build is 2.11.0
    monkeypatch.setattr(envs, "current_platform", lambda wheel_platforms: "linux-aarch64")
    monkeypatch.setattr(envs, "detect_cuda_home", lambda: Path("/opt/cuda"))
    monkeypatch.setattr(envs, "nvcc_version", lambda home: ("12.8", "12.8.93"))
    target = auto_target(matrix, "sageattention", None, None, None, python="3.12")
    assert (target.id, target.torch) == ("linux-aarch64-sageattention-abi3-cu128-python312", "2.11.0")
    assert target.wheel_name == "sageattention-2.2.0+cu12-cp310-abi3-linux_aarch64.whl"
    target = auto_target(matrix, "sageattention", None, None, None, torch="2.8.0", python="3.12")
    assert target.cuda == "12.9"  # 2.8.0's only aarch64 CUDA build
    assert REPO_ROOT.is_dir()
