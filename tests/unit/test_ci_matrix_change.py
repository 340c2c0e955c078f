"""Adding a PyTorch release is an edit of build-matrix.yaml alone: after regenerating, the CI matrix that
the workflows compute, the Docker Bake targets and BUILD_MATRIX.md all change, and nothing else needs an
edit. Done on a temporary copy of the repository's files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from sagebuild import cli
from sagebuild.matrix import REPO_ROOT

NEW_TORCH = "2.15.0"
NEW_IDS = {
    f"{platform}-sageattention-pytorch215-cu{cuda}-python{python}"
    for platform in ("linux", "windows", "linux-aarch64")
    for cuda in ("128", "130")
    for python in ("310", "311", "312", "313", "314")
}


@pytest.fixture
def repo(tmp_path) -> Path:
    for name in ("build-matrix.yaml", "pyproject.toml", "BUILD_MATRIX.md", "docker-bake.hcl"):
        shutil.copy2(REPO_ROOT / name, tmp_path / name)
    sage3 = REPO_ROOT / "sageattention3_blackwell" / "pyproject.toml"
    if sage3.is_file():  # the sageattn3 version comes from here once its sources exist
        (tmp_path / sage3.parent.name).mkdir()
        shutil.copy2(sage3, tmp_path / sage3.parent.name / sage3.name)
    shutil.copytree(REPO_ROOT / ".github", tmp_path / ".github")
    return tmp_path


def run(capsys, repo: Path, *args: str) -> tuple[int, str]:
    code = cli.main(["--matrix", str(repo / "build-matrix.yaml"), *args])
    out, err = capsys.readouterr()
    return code, out + err


def planned_ids(capsys, repo: Path, profile: str) -> set[str]:
    ids = set()
    for system in ("Linux", "Windows"):  # exactly what the build workflows run
        code, out = run(capsys, repo, "plan", "--profile", profile, "--package", "sageattention",
                        "--system", system, "--allow-empty", "--format", "github")  # fmt: skip
        assert code == 0, out
        ids |= {entry["id"] for entry in json.loads(out)["include"]}
    return ids


def add_torch_release(repo: Path) -> None:
    path = repo / "build-matrix.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["torch"][NEW_TORCH] = {
        "cuda": ["12.8", "13.0"],
        "python": ["3.10", "3.11", "3.12", "3.13", "3.14"],
        "registry_cuda": {"linux": "13.0", "windows": None, "linux-aarch64": "13.0"},
        "source": "test",
    }
    data["sets"]["sage2-current"]["builds"][0]["torch"].append(NEW_TORCH)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


GENERATED = ("build-matrix.yaml", "BUILD_MATRIX.md", "docker-bake.hcl")


def test_new_pytorch_release_flows_into_ci_bake_and_docs(repo, capsys):
    checked_in = {name: (REPO_ROOT / name).read_bytes() for name in GENERATED}
    assert repo != REPO_ROOT and all((repo / name).read_bytes() == checked_in[name] for name in GENERATED)
    before = planned_ids(capsys, repo, "sage2-current")
    workflows = {p.name: p.read_text(encoding="utf-8") for p in (repo / ".github" / "workflows").iterdir()}

    add_torch_release(repo)
    assert run(capsys, repo, "validate")[0] == 0

    # the CI matrix (the workflows' own command) has the ten new builds per platform (a release without
    # platform_cuda has every CUDA build on every platform), nothing else changed
    after = planned_ids(capsys, repo, "sage2-current")
    assert after - before == NEW_IDS and before <= after

    # the generated files are stale until regenerated, then current
    assert run(capsys, repo, "bake", "--check")[0] == 1
    assert run(capsys, repo, "docs", "--check")[0] == 1
    assert run(capsys, repo, "bake")[0] == 0
    assert run(capsys, repo, "docs")[0] == 0
    assert run(capsys, repo, "bake", "--check")[0] == 0
    assert run(capsys, repo, "docs", "--check")[0] == 0

    # all three outputs changed on the copy, and the repository's own files did not
    for name in GENERATED:
        assert (repo / name).read_bytes() != checked_in[name], f"{name} did not change"
        assert (REPO_ROOT / name).read_bytes() == checked_in[name], f"the test wrote the real {name}"

    bake_file = (repo / "docker-bake.hcl").read_text(encoding="utf-8")
    for build_id in sorted(i for i in NEW_IDS if i.startswith("linux-")):
        assert f'target "{build_id}" {{' in bake_file
        assert f'target "test-{build_id}" {{' in bake_file
    assert 'group "pytorch215" {' in bake_file
    assert "windows-" not in bake_file
    docs = (repo / "BUILD_MATRIX.md").read_text(encoding="utf-8")
    assert f"| {NEW_TORCH} |" in docs and "linux-sageattention-pytorch215-cu130-python314" in docs

    # the other frontends know the new builds too
    code, out = run(capsys, repo, "cibw", "--target", "linux-sageattention-pytorch215-cu130-python312")
    assert code == 0 and "torch==2.15.0" in out
    code, out = run(capsys, repo, "ci-env", "--target", "windows-sageattention-pytorch215-cu128-python310")
    assert code == 0 and "cuda-release=12.8.1" in out

    # and no workflow needed an edit
    assert workflows == {
        p.name: p.read_text(encoding="utf-8") for p in (repo / ".github" / "workflows").iterdir()
    }
    for text in workflows.values():
        assert NEW_TORCH not in text and "pytorch215" not in text


# A further platform (seed 002, AC10): an entry under platforms: and nothing else; what PyTorch and the
# toolkit packages have for it is data too (platform_cuda, left_out, pip: platforms). Made up for the
# test (a real digest is not needed to plan; the image is checked for its policy).
PPC = {
    "system": "Linux",
    "wheel_platform": "linux_ppc64le",
    "repair_platform": "manylinux_2_28_ppc64le",
    "runner": "ubuntu-24.04-ppc64le",
    "docker_platform": "linux/ppc64le",
    "manylinux_image": "quay.io/pypa/manylinux_2_28_ppc64le@sha256:" + "0" * 64,
}


def write(path: Path, data: dict) -> None:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def test_a_new_platform_is_configuration_only(repo, capsys):
    from sagebuild import bake, ci, cibw
    from sagebuild.index import EnvInfo, which
    from sagebuild.matrix import Matrix

    path = repo / "build-matrix.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["platforms"]["linux-ppc64le"] = PPC
    write(path, data)
    workflows = {p.name: p.read_text(encoding="utf-8") for p in (repo / ".github" / "workflows").iterdir()}

    code, out = run(capsys, repo, "validate")
    assert code == 0, out
    code, out = run(
        capsys, repo, "plan", "--profile", "stable", "--platform", "linux-ppc64le", "--format", "github"
    )
    assert code == 0, out
    include = json.loads(out)["include"]
    assert [e["id"] for e in include] == [
        "linux-ppc64le-sageattention-pytorch26-cu126-python312",
        "linux-ppc64le-sageattention-pytorch27-cu128-python312",
        "linux-ppc64le-sageattention-pytorch28-cu129-python312",
    ]
    assert {e["runner"] for e in include} == {"ubuntu-24.04-ppc64le"}
    assert include[0]["wheel"] == "sageattention-2.2.0-260.126-cp312-cp312-linux_ppc64le.whl"
    with pytest.raises(SystemExit):
        cli.main(["--matrix", str(path), "plan", "--help"])
    assert "linux-ppc64le (linux_ppc64le)" in " ".join(capsys.readouterr().out.split())

    # the Linux build workflow's plan (--system Linux) now holds every Linux platform, each with its runner
    code, out = run(capsys, repo, "plan", "--profile", "stable", "--system", "Linux", "--format", "github")
    runners = {e["platform"]: e["runner"] for e in json.loads(out)["include"]}
    assert runners == {
        "linux": "ubuntu-24.04",
        "linux-aarch64": "ubuntu-24.04-arm",
        "linux-ppc64le": "ubuntu-24.04-ppc64le",
    }

    matrix = Matrix.load(path)
    # Docker Bake: its targets in its own image and Docker platform, the first platform's names unchanged
    text = bake.render(matrix)
    assert 'variable "MANYLINUX_IMAGE_LINUX_PPC64LE" {' in text and PPC["manylinux_image"] in text
    assert 'variable "MANYLINUX_IMAGE" {' in text and 'variable "MANYLINUX_IMAGE_LINUX_AARCH64" {' in text
    assert 'target "linux-ppc64le-sageattention-pytorch28-cu129-python312" {' in text
    assert 'target "toolchain-linux-ppc64le-cu129" {' in text and 'target "toolchain-cu129" {' in text
    assert '"linux/ppc64le"' in text and 'group "linux-ppc64le" {' in text
    assert run(capsys, repo, "bake")[0] == 0 and run(capsys, repo, "bake", "--check")[0] == 0
    assert run(capsys, repo, "docs")[0] == 0
    assert "linux-ppc64le" in (repo / "BUILD_MATRIX.md").read_text(encoding="utf-8")

    # cibuildwheel and the CI toolkit plan: the pip toolkit packages do not list the platform, so the
    # installer, until the matrix says they have its wheels
    target = matrix.find_target("linux-ppc64le-sageattention-pytorch2141-cu130-python312")
    config = cibw.config_for(matrix, [target])
    assert config["identifiers"] == ["cp312-manylinux_ppc64le"] and config["platform"] == "linux"
    assert config["options"]["archs"] == ["ppc64le"]
    assert config["options"]["manylinux-ppc64le-image"] == "sagebuild-toolchain:linux-ppc64le-cu130"
    assert "--plat manylinux_2_28_ppc64le " in config["options"]["repair-wheel-command"]
    assert cibw.as_env(config)["CIBW_MANYLINUX_PPC64LE_IMAGE"] == "sagebuild-toolchain:linux-ppc64le-cu130"
    assert ci.toolkit_plan(matrix, target).source == "installer"
    data["cuda"]["13.0"]["pip"]["platforms"].append("linux-ppc64le")
    write(path, data)
    assert ci.toolkit_plan(Matrix.load(path), target).source == "pip"

    # `which` answers for a machine of it, and its wheel names, as built and repaired, decode to it
    env = EnvInfo("3.12", "linux-ppc64le", "2.14.1", "13.0")
    code, lines = which(matrix, env)
    assert code == 0 and lines[1] == "build id: linux-ppc64le-sageattention-abi3-cu130-python312"
    assert "sageattention-2.2.0-cp310-abi3-manylinux_2_28_ppc64le.whl once repaired" in lines[2]
    for name in ("sageattention-2.2.0-cp310-abi3-manylinux_2_28_ppc64le.whl",
                 "sageattention-2.2.0-280.129-cp312-cp312-linux_ppc64le.whl"):  # fmt: skip
        assert matrix.parse_wheel_name(name).platform == "linux-ppc64le"

    # fewer PyTorch builds there: platform_cuda, and validation asks for the why of each gap
    data["torch"]["2.14.1"]["platform_cuda"]["linux-ppc64le"] = ["13.0"]
    write(path, data)
    code, out = run(capsys, repo, "validate")
    assert code == 2 and "linux-ppc64le lacks torch 2.14.1 + CUDA 12.8" in out
    assert "add a left_out note under platforms.linux-ppc64le" in out
    data["platforms"]["linux-ppc64le"]["left_out"] = [
        {"torch": "2.14.1", "cuda": "12.8", "why": "none there"}
    ]
    write(path, data)
    code, out = run(capsys, repo, "validate")
    assert code == 0, out
    narrowed = Matrix.load(path)
    assert {t.cuda for t in narrowed.profile_targets("pytorch214", platform="linux-ppc64le")} == {"13.0"}
    assert run(capsys, repo, "docs")[0] == 0
    assert "| linux-ppc64le | PyTorch 2.14.1; CUDA 12.8;" in (repo / "BUILD_MATRIX.md").read_text(
        encoding="utf-8"
    )

    # and no workflow needed an edit
    assert workflows == {
        p.name: p.read_text(encoding="utf-8") for p in (repo / ".github" / "workflows").iterdir()
    }
