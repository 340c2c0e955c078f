"""``sagebuild index`` and ``which``: pip, pointed at our index, installs the wheel that fits the torch
already installed (tiny dummy wheels, a throw-away venv, no network)."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from wheel.wheelfile import WheelFile

from sagebuild import cli
from sagebuild.envs import file_uri, venv_python
from sagebuild.index import EnvInfo, abi3_target, build_index, which
from sagebuild.matrix import load

PY = f"cp{sys.version_info[0]}{sys.version_info[1]}"
PY_DOT = f"{sys.version_info[0]}.{sys.version_info[1]}"
linux_x86 = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and platform.machine() == "x86_64"), reason="linux_x86_64 wheels"
)


def dummy_wheel(
    folder: Path, filename: str, version: str, requires=(), build=None, tag="py3-none-any"
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    project = filename.split("-")[0]
    with WheelFile(str(folder / filename), "w") as wheel:
        wheel.writestr(f"{project}/__init__.py", f"BUILT = {filename!r}\n")
        meta = ["Metadata-Version: 2.1", f"Name: {project}", f"Version: {version}"]
        meta += [f"Requires-Dist: {r}" for r in requires]
        wheel.writestr(f"{wheel.dist_info_path}/METADATA", "\n".join(meta) + "\n\n")
        info = [
            "Wheel-Version: 1.0",
            "Generator: test",
            f"Root-Is-Purelib: {str(tag == 'py3-none-any').lower()}",
        ]
        info += [f"Tag: {tag}"] + ([f"Build: {build}"] if build else [])
        wheel.writestr(f"{wheel.dist_info_path}/WHEEL", "\n".join(info) + "\n")
    return folder / filename


@pytest.fixture(scope="module")
def matrix():
    return load()


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wheelhouse")
    plat = f"{PY}-{PY}-linux_x86_64"
    dummy_wheel(folder, f"sageattention-2.2.0-280.129-{plat}.whl", "2.2.0", ["torch==2.8.0"], "280.129", plat)
    dummy_wheel(
        folder, f"sageattention-2.2.0-2141.130-{plat}.whl", "2.2.0", ["torch==2.14.1"], "2141.130", plat
    )
    dummy_wheel(folder, "sageattention-2.2.0-py3-none-any.whl", "2.2.0", ["torch>=2.4"])
    for version in ("2.9.0", "2.14.1"):
        cuda = "cu128" if version == "2.9.0" else "cu130"
        local = f"1.0.0+{cuda}torch{version}"
        dummy_wheel(folder, f"sageattn3-{local}-{plat}.whl", local, [f"torch=={version}"], None, plat)
    return folder


def pip_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


def venv_with_torch(tmp_path: Path, torch_version: str) -> Path:
    """A venv (no pip of its own: the test's pip drives it) holding a dummy torch."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = Path(venv_python(tmp_path / "venv"))
    torch = dummy_wheel(tmp_path / "torch", f"torch-{torch_version}-py3-none-any.whl", torch_version)
    pip(python, "install", "--no-index", str(torch))
    return python


def pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "--python", str(python), *args]
    return subprocess.run(cmd, env=pip_env(), check=True, capture_output=True, text=True)


def installed_build(python: Path, project: str) -> str:
    code = (
        "import importlib.metadata as m, sys\n"
        f"d = m.distribution({project!r})\n"
        "print(d.version, (d.read_text('WHEEL') or '').split('Build: ')[-1].split()[0] if 'Build:' in "
        "(d.read_text('WHEEL') or '') else '-')\n"
    )
    return subprocess.run(
        [str(python), "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()


def test_index_pages(wheels, matrix, tmp_path):
    out = tmp_path / "idx"
    manifest = build_index(wheels, out, matrix)
    page_dir = out / "simple" / "sageattention"
    page = (page_dir / "index.html").read_text()
    wheel = wheels / f"sageattention-2.2.0-280.129-{PY}-{PY}-linux_x86_64.whl"
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    href = Path(os.path.relpath(wheel, page_dir)).as_posix()
    assert f'href="{href}#sha256={digest}"' in page
    assert '<meta name="pypi:repository-version" content="1.0">' in page
    assert 'href="sageattn3/"' in (out / "simple" / "index.html").read_text()
    assert sorted(manifest["variants"]) == ["torch2.14.1-cu130", "torch2.8.0-cu129", "torch2.9.0-cu128"]
    assert manifest["variants"]["torch2.8.0-cu129"] == sorted(
        [wheel.name, "sageattention-2.2.0-py3-none-any.whl"]
    )
    assert len(manifest["variants"]["torch2.14.1-cu130"]) == 3  # sageattention, sageattn3, the pure wheel


@linux_x86
def test_pip_picks_the_wheel_for_the_installed_torch(wheels, matrix, tmp_path):
    build_index(wheels, wheels, matrix)
    python = venv_with_torch(tmp_path, "2.8.0")
    env = EnvInfo(PY_DOT, "linux", "2.8.0", "12.9")
    code, lines = which(matrix, env, "sageattention", wheels)
    assert code == 0, lines
    command = lines[-1].split()
    assert command[:3] == ["pip", "install", "--index-url"]
    assert command[3] == file_uri((wheels / "torch2.8.0-cu129" / "simple").resolve())
    pip(python, "install", "--index-url", command[3], "sageattention")
    assert installed_build(python, "sageattention") == "2.2.0 280.129"


@linux_x86
def test_resolver_picks_sageattn3_by_local_version(wheels, matrix, tmp_path):
    build_index(wheels, wheels, matrix)
    python = venv_with_torch(tmp_path, "2.9.0")
    pip(python, "install", "--index-url", file_uri((wheels / "simple").resolve()), "sageattn3")
    assert installed_build(python, "sageattn3") == "1.0.0+cu128torch2.9.0 -"


def test_which_without_a_fitting_build(matrix, tmp_path):
    code, lines = which(matrix, EnvInfo("3.9", "linux", "2.8.0", "13.0"))  # Python below the abi3 floor
    assert code == 1 and "has no CUDA 13.0 build" in lines[-2]
    code, lines = which(matrix, EnvInfo("3.12", "linux", "2.13.0", None))
    assert code == 0 and lines[-1] == "  pip install sageattention-2.2.0-py3-none-any.whl"
    code, lines = which(matrix, EnvInfo("3.12", "linux", None, None))
    assert code == 1 and "install PyTorch first" in lines[-1]
    code, lines = which(matrix, EnvInfo("3.9", "windows", "2.8.0", "12.9"))
    assert "  python -m sagebuild build --target windows-sageattention-pytorch28-cu129-python39" in lines


def test_index_cli(wheels, tmp_path, capsys):
    assert cli.main(["index", str(wheels), "--out", str(tmp_path / "out"), "--copy"]) == 0
    assert (tmp_path / "out" / "files" / "sageattention-2.2.0-py3-none-any.whl").is_file()
    page = (tmp_path / "out" / "torch2.8.0-cu129" / "simple" / "sageattention" / "index.html").read_text()
    assert 'href="../../../files/sageattention-2.2.0-280.129-' in page
    assert "install with: pip install --index-url file://" in capsys.readouterr().out
    assert cli.main(["index", str(tmp_path / "empty")]) == 1


def test_index_rejects_files_that_are_not_wheels(wheels, matrix, tmp_path, capsys):
    """Each bad .whl file is named with its reason and nothing is written (docs/building.md)."""
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    for path in wheels.glob("*.whl"):
        (folder / path.name).write_bytes(path.read_bytes())
    plat = f"{PY}-{PY}-linux_x86_64"
    (folder / f"sageattention-2.2.0-260.126-{plat}.whl").write_bytes(b"")
    (folder / f"sageattention-2.2.0-270.128-{plat}.whl").write_text("<html>404</html>\n")
    with zipfile.ZipFile(folder / f"sageattention-2.2.0-290.128-{plat}.whl", "w") as archive:
        archive.writestr("sageattention/__init__.py", "")
    (folder / "notes-on-this.whl").write_text("x")
    code = cli.main(["index", str(folder), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert "4 of the 9 .whl files" in err and "nothing was indexed" in err
    assert f"sageattention-2.2.0-260.126-{plat}.whl: an empty file (0 bytes)" in err
    assert f"sageattention-2.2.0-270.128-{plat}.whl: not a zip archive" in err
    assert f"sageattention-2.2.0-290.128-{plat}.whl: no .dist-info folder with WHEEL and METADATA" in err
    assert "notes-on-this.whl: not a valid wheel name" in err
    assert not (tmp_path / "out").exists()


def test_index_notes_other_files_and_indexes_the_wheels(wheels, matrix, tmp_path, capsys):
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    for path in wheels.glob("*.whl"):
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "SHA256SUMS").write_text("")
    (folder / f"sageattention-2.2.0-280.129-{PY}-{PY}-linux_x86_64.whl.partial").write_bytes(b"")
    manifest = build_index(folder, tmp_path / "out", matrix)
    assert len(manifest["simple"]) == 5
    err = capsys.readouterr().err
    assert "not indexed (not .whl files): SHA256SUMS, sageattention-2.2.0-280.129-" in err


def abi3_wheel_name(matrix, cuda: str, platform: str = "linux") -> str:
    """The abi3 wheel's name as the build names it (the target of the abi3-release profile)."""
    (target,) = [
        t
        for t in matrix.profile_targets("abi3-release", platform, "sageattention")
        if t.cuda.split(".")[0] == cuda.split(".")[0]
    ]
    return target.wheel_name


def test_which_names_the_cuda_13_abi3_wheel(matrix):
    code, lines = which(matrix, EnvInfo("3.12", "linux", "2.11.0", "13.0"))
    wheel = abi3_wheel_name(matrix, "13.0")
    assert wheel == "sageattention-2.2.0-cp310-abi3-linux_x86_64.whl"
    assert code == 0, lines
    assert lines[1] == "build id: linux-sageattention-abi3-cu130-python312"
    assert lines[2].startswith(f"wheel:    {wheel} (sageattention-2.2.0-cp310-abi3-manylinux_2_28_x86_64.whl")
    assert lines[3].startswith("CUDA line 13 (the default line)")
    assert "  pip install sageattention" in lines
    assert "  python -m sagebuild build --target linux-sageattention-abi3-cu130-python312" in lines
    assert not any("pytorch211" in line for line in lines)
    # a torch the matrix does not know, on Windows with Python 3.14: the same line's wheel
    code, lines = which(matrix, EnvInfo("3.14", "windows", "2.15.0", "13.2"))
    assert code == 0 and lines[2] == f"wheel:    {abi3_wheel_name(matrix, '13.0', 'windows')}"


def test_which_names_the_cuda_12_abi3_wheel_and_its_index_path(matrix, capsys):
    code, lines = which(matrix, EnvInfo("3.12", "linux", "2.8.0", "12.8"))
    wheel = abi3_wheel_name(matrix, "12.8")
    assert wheel == "sageattention-2.2.0+cu12-cp310-abi3-linux_x86_64.whl"
    assert code == 0, lines
    assert lines[2].startswith(f"wheel:    {wheel} ")
    assert lines[3].startswith("CUDA line 12:")
    assert "  pip install --index-url INDEX/cu12/simple sageattention" in lines
    assert "  pip install sageattention" not in lines
    assert "  python -m sagebuild build --target linux-sageattention-abi3-cu128-python312" in lines
    args = ["which", "--torch", "2.8.0", "--cuda", "12.8", "--python", "3.12", "--platform", "linux"]
    assert cli.main(args) == 0
    assert f"wheel:    {wheel}" in capsys.readouterr().out


def test_which_on_an_aarch64_machine(matrix, tmp_path, capsys, monkeypatch):
    """An arm64 server (GH200, GB200): the machine is the matrix's platform of its wheel tag, and `which`
    names that platform's abi3 wheel of torch's CUDA line, found in an index under its repaired name."""
    from sagebuild import envs
    from sagebuild.index import current_env

    monkeypatch.setattr(envs.sysconfig, "get_platform", lambda: "linux-aarch64")
    assert current_env(matrix).platform == "linux-aarch64"
    code, lines = which(matrix, EnvInfo("3.12", "linux-aarch64", "2.14.1", "13.0"))
    wheel = abi3_wheel_name(matrix, "13.0", "linux-aarch64")
    assert code == 0 and wheel == "sageattention-2.2.0-cp310-abi3-linux_aarch64.whl"
    assert lines[1] == "build id: linux-aarch64-sageattention-abi3-cu130-python312"
    assert (
        lines[2]
        == f"wheel:    {wheel} (sageattention-2.2.0-cp310-abi3-manylinux_2_28_aarch64.whl once repaired)"
    )
    assert lines[3].startswith("CUDA line 13 (the default line)")
    assert "  pip install sageattention" in lines  # the plain index's aarch64 torch is a CUDA 13.0 build
    # the CUDA 12 line: built with torch 2.11.0 (2.14.1 has no aarch64 CUDA 12.8 build), for every torch
    code, lines = which(matrix, EnvInfo("3.11", "linux-aarch64", "2.7.0", "12.8"))
    assert code == 0 and lines[1] == "build id: linux-aarch64-sageattention-abi3-cu128-python312"
    assert lines[2].startswith("wheel:    sageattention-2.2.0+cu12-cp310-abi3-linux_aarch64.whl ")
    assert "  pip install --index-url INDEX/cu12/simple sageattention" in lines
    # below the abi3 floor: the per-torch wheel of a CUDA build PyTorch publishes for aarch64, or none
    code, lines = which(matrix, EnvInfo("3.9", "linux-aarch64", "2.8.0", "12.9"))
    assert code == 0 and lines[2] == "build id: linux-aarch64-sageattention-pytorch28-cu129-python39"
    assert lines[3] == "wheel:    sageattention-2.2.0-280.129-cp39-cp39-linux_aarch64.whl"
    code, lines = which(matrix, EnvInfo("3.9", "linux-aarch64", "2.8.0", "12.8"))
    assert code == 1 and "has no CUDA 12.8 build for linux-aarch64; there it ships CUDA 12.9" in lines[-2]
    # an index with the repaired aarch64 wheel and the x86_64 one: the aarch64 one is named
    folder = tmp_path / "wheelhouse"
    for arch in ("aarch64", "x86_64"):
        tag = f"cp310-abi3-manylinux_2_28_{arch}"
        dummy_wheel(folder, f"sageattention-2.2.0-{tag}.whl", "2.2.0", ["torch>=2.6.0"], None, tag)
    manifest = build_index(folder, folder, matrix)
    assert len(manifest["variants"]["cu13"]) == 2
    code, lines = which(matrix, EnvInfo("3.12", "linux-aarch64", "2.11.0", "13.0"), "sageattention", folder)
    assert (
        code == 0
        and lines[-2]
        == f"in {folder}: sageattention-2.2.0-cp310-abi3-manylinux_2_28_aarch64.whl; install it with:"
    )
    args = ["which", "--torch", "2.12.0", "--cuda", "13.0", "--python", "3.13", "--platform", "linux-aarch64"]
    assert cli.main(args) == 0
    assert "build id: linux-aarch64-sageattention-abi3-cu130-python312" in capsys.readouterr().out


def test_which_below_the_abi3_floor_names_the_per_torch_wheel(matrix):
    code, lines = which(matrix, EnvInfo("3.12", "linux", "2.5.0", "12.4"))
    assert code == 1
    assert lines[1] == (
        f"the abi3 wheel ({abi3_wheel_name(matrix, '12.4')}) does not fit: it needs torch >= 2.6.0 "
        "(its floor), this is torch 2.5.0"
    )
    assert lines[2].startswith("no sageattention build fits this environment: PyTorch 2.5.0 is not in")
    assert lines[3].endswith("sageattention-2.2.0-py3-none-any.whl")
    code, lines = which(matrix, EnvInfo("3.9", "linux", "2.6.0", "12.6"))  # below the Python floor
    assert code == 0 and "needs Python >= 3.10 (its floor)" in lines[1]
    assert lines[2] == "build id: linux-sageattention-pytorch26-cu126-python39"
    assert lines[3] == "wheel:    sageattention-2.2.0-260.126-cp39-cp39-linux_x86_64.whl"
    # a CUDA line without abi3 wheels and a CPU build of torch: the answers they had
    code, lines = which(matrix, EnvInfo("3.12", "linux", "2.11.0", "11.8"))
    assert code == 1 and "has no CUDA 11.8 build" in lines[1] and len(lines) == 3
    code, lines = which(matrix, EnvInfo("3.12", "linux", "2.11.0", None))
    assert code == 0 and lines[-1] == "  pip install sageattention-2.2.0-py3-none-any.whl"


def test_which_names_sageattn3_s_abi3_wheel(matrix):
    """sageattn3 has abi3 wheels (sage3-abi3): every torch from 2.9.0 on gets the wheel of its CUDA line."""
    assert abi3_target(matrix, "sageattn3", "linux", "12.8").wheel_name == (
        "sageattn3-1.0.0+cu12-cp310-abi3-linux_x86_64.whl"
    )
    code, lines = which(matrix, EnvInfo("3.12", "linux", "2.9.0", "12.8"), "sageattn3")
    assert code == 0
    assert lines[:4] == [
        "environment: Python 3.12, platform linux, torch 2.9.0 (CUDA 12.8)",
        "build id: linux-sageattn3-abi3-cu128-python312",
        "wheel:    sageattn3-1.0.0+cu12-cp310-abi3-linux_x86_64.whl "
        "(sageattn3-1.0.0+cu12-cp310-abi3-manylinux_2_28_x86_64.whl once repaired)",
        "CUDA line 12: one abi3 wheel for torch CUDA 12.x, every torch >= 2.9.0 and Python >= 3.10",
    ]
    code, lines = which(matrix, EnvInfo("3.12", "linux", "2.11.0", "13.0"), "sageattn3")
    assert code == 0 and "wheel:    sageattn3-1.0.0-cp310-abi3-linux_x86_64.whl" in lines[2]
    assert "  pip install sageattn3" in lines


def test_which_with_an_index_of_abi3_wheels(wheels, matrix, tmp_path):
    folder = tmp_path / "wheelhouse"
    for path in wheels.glob("*.whl"):
        if path.name.startswith("sageattention-"):
            (folder / path.name).parent.mkdir(exist_ok=True)
            (folder / path.name).write_bytes(path.read_bytes())
    tag = "cp310-abi3-manylinux_2_28_x86_64"  # repaired: the platform tag differs from the build's
    repaired = f"sageattention-2.2.0+cu12-{tag}.whl"
    dummy_wheel(folder, repaired, "2.2.0+cu12", ["torch>=2.6.0"], None, tag)
    manifest = build_index(folder, folder, matrix)
    assert repaired in manifest["variants"]["cu12"]
    code, lines = which(matrix, EnvInfo("3.12", "linux", "2.8.0", "12.8"), "sageattention", folder)
    assert code == 0, lines
    assert lines[-2] == f"in {folder}: {repaired}; install it with:"
    assert (
        lines[-1]
        == f"  pip install --index-url {file_uri((folder / 'cu12' / 'simple').resolve())} sageattention"
    )
    # CUDA 13: neither its abi3 wheel nor a per-torch wheel for torch 2.11 is in the index
    code, lines = which(matrix, EnvInfo("3.12", "linux", "2.11.0", "13.0"), "sageattention", folder)
    assert code == 1, lines
    assert f"not in {folder}; build it with:" in lines
    assert lines[-1] == f"  pip install wheelhouse/{abi3_wheel_name(matrix, '13.0')}"
    # an index of per-torch wheels only: the per-torch wheel that fits and is there
    pinned = tmp_path / "pinned"
    build_index(wheels, pinned, matrix)
    code, lines = which(matrix, EnvInfo(PY_DOT, "linux", "2.8.0", "12.9"), "sageattention", pinned)
    assert code == 0, lines
    if sys.version_info >= (3, 10):  # the abi3 wheel fits this Python, and the index lacks it
        assert lines[-2].startswith(
            f"not in {pinned}; the per-torch wheel that fits is (sageattention-2.2.0-280.129-"
        )
    simple = file_uri((pinned / "torch2.8.0-cu129" / "simple").resolve())
    assert lines[-1] == f"  pip install --index-url {simple} sageattention"
    code, lines = which(
        matrix, EnvInfo("3.12", "linux", "2.11.0", "13.0"), "sageattention", tmp_path / "none"
    )
    assert code == 1 and "not found" in lines[-1]
