"""docker-bake.hcl and dockerfile.builder.linux: generated from the matrix, current, parseable HCL whose
targets and groups are exactly the matrix's Linux builds, and a Dockerfile with the stages and arguments
the Bake file relies on. (No Docker engine here: nothing is built; docs/ci.md says so.)
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re

import pytest

from sagebuild import bake, cli, tags
from sagebuild.ci import toolkit_release
from sagebuild.errors import MatrixError
from sagebuild.matrix import REPO_ROOT, Matrix, load


def _q(value: str) -> str:
    return json.dumps(value)


try:
    import hcl2
except ImportError:  # fails below with the install command (see require)
    hcl2 = None


def require(module, name: str):
    """A dev tool from requirements-dev.txt: missing fails the test, unless SAGE_ALLOW_MISSING_LINTERS=1."""
    if module is not None:
        return module
    hint = f"{name} is missing: pip install -r requirements-dev.txt"
    if os.environ.get("SAGE_ALLOW_MISSING_LINTERS") == "1":
        pytest.skip(hint)
    pytest.fail(hint + " (set SAGE_ALLOW_MISSING_LINTERS=1 to skip instead)")


BAKE = REPO_ROOT / "docker-bake.hcl"
DOCKERFILE = REPO_ROOT / "dockerfile.builder.linux"
# No host name is written into these files (indexes and images are configuration): nothing that looks
# like a URL or a domain.
URL_OR_HOST = re.compile(r"://|\b[a-z0-9-]+(?:\.[a-z0-9-]+)*\.(?:org|io|com|net|dev)\b")


def parse(text: str, strip: bool = True) -> dict:
    require(hcl2, "python-hcl2")
    options = hcl2.SerializationOptions(strip_string_quotes=strip, with_comments=False, explicit_blocks=False)
    data = hcl2.loads(text, serialization_options=options)
    return {kind: {k: v for block in data.get(kind, []) for k, v in block.items()} for kind in data}


@pytest.fixture(scope="module")
def matrix():
    return load()


@pytest.fixture(scope="module")
def parsed():
    return parse(BAKE.read_text(encoding="utf-8"))


def expand(groups: dict, name: str) -> list[str]:
    out = []
    for member in groups[name]["targets"]:
        out += expand(groups, member) if member in groups else [member]
    return out


def test_checked_in_bake_file_is_current(matrix, capsys):
    assert BAKE.read_text(encoding="utf-8") == bake.render(matrix), (
        "docker-bake.hcl is stale: run `python -m sagebuild bake` and commit it"
    )
    assert cli.main(["bake", "--check"]) == 0
    assert bake.render(matrix) == bake.render(load())  # deterministic


def linux_targets(matrix, profile: str | None = None) -> list:
    """The builds of one profile (or of every profile) on the matrix's Linux platforms, platform by
    platform: what docker-bake.hcl holds."""
    profiles = [profile] if profile else list(matrix.profiles)
    return [
        t
        for platform in bake.bake_platforms(matrix)
        for name in profiles
        for t in matrix.profile_targets(name, platform=platform.name)
    ]


def test_targets_are_the_linux_builds_of_the_matrix(matrix, parsed):
    linux = {t.id: t for t in linux_targets(matrix)}
    assert {t.platform for t in linux.values()} == {"linux", "linux-aarch64"}
    targets = parsed["target"]
    built = {name for name, body in targets.items() if body.get("target") == "wheel"}
    assert built == set(linux)
    assert {name for name, body in targets.items() if body.get("target") == "test"} == {
        f"test-{i}" for i in linux
    }
    for build_id, target in linux.items():
        body = targets[build_id]
        cuda = f"_{tags.cuda_tag(target.cuda)}"
        assert body["inherits"] == [f"_{target.platform}", cuda]
        assert body["args"] == {
            "BUILD_ID": build_id,
            "PYTHON_ABI": f"{target.python_tag}-{target.python_tag}",
        }
        assert body["output"] == ["type=local,dest=${WHEELHOUSE}"]
        assert targets[cuda]["args"]["CUDA_VERSION"] == target.cuda
        release = toolkit_release(matrix, target.cuda)
        assert targets[cuda]["args"]["CUDA_IMAGE"] == f"nvidia/cuda:{release}-devel-${{CUDA_IMAGE_DISTRO}}"
        assert targets[f"test-{build_id}"]["inherits"] == [build_id]
    assert targets["_builder"]["dockerfile"] == "dockerfile.builder.linux"
    assert targets["_linux"]["inherits"] == ["_builder"]
    assert targets["_linux"]["platforms"] == [matrix.platforms["linux"].docker_platform] == ["linux/amd64"]
    assert targets["toolchain-cu128"]["inherits"] == ["_linux", "_cu128"]
    assert targets["toolchain-cu128"]["tags"] == ["sagebuild-toolchain:cu128"]
    # the aarch64 builds: in their own manylinux image, for linux/arm64
    arm = matrix.platforms["linux-aarch64"]
    assert targets["_linux-aarch64"]["platforms"] == [arm.docker_platform] == ["linux/arm64"]
    assert targets["_linux-aarch64"]["args"] == {"MANYLINUX_IMAGE": "MANYLINUX_IMAGE_LINUX_AARCH64"}
    assert parsed["variable"]["MANYLINUX_IMAGE_LINUX_AARCH64"] == {"default": arm.manylinux_image}
    assert targets["linux-aarch64-sageattention-abi3-cu130-python312"]["inherits"] == [
        "_linux-aarch64",
        "_cu130",
    ]
    assert targets["toolchain-linux-aarch64-cu128"]["inherits"] == ["_linux-aarch64", "_cu128"]
    assert targets["toolchain-linux-aarch64-cu128"]["tags"] == ["sagebuild-toolchain:linux-aarch64-cu128"]


def test_groups(matrix, parsed):
    groups = parsed["group"]
    linux_ids = list(dict.fromkeys(t.id for t in linux_targets(matrix)))
    assert expand(groups, "default") == [t.id for t in linux_targets(matrix, "default")]
    assert expand(groups, "default") == [
        "linux-sageattention-abi3-cu130-python312",
        "linux-aarch64-sageattention-abi3-cu130-python312",
    ]
    for platform in ("linux", "linux-aarch64"):  # one group per Linux platform
        assert expand(groups, platform) == [i for i in linux_ids if i.startswith(platform + "-sage")]
    assert expand(groups, "all") == linux_ids
    assert expand(groups, "test-all") == [f"test-{i}" for i in linux_ids]
    for profile in matrix.profiles:
        ids = list(dict.fromkeys(t.id for t in linux_targets(matrix, profile)))
        assert expand(groups, f"profile-{profile}") == ids if ids else f"profile-{profile}" not in groups
    by_torch: dict[str, set[str]] = {}
    for profile in matrix.profiles:
        for t in linux_targets(matrix, profile):
            major, minor, _ = tags.release_parts(t.torch, 3)
            by_torch.setdefault(f"pytorch{major}{minor}", set()).add(t.id)
    for group, ids in by_torch.items():
        assert set(expand(groups, group)) == ids
    assert {"pytorch26", "pytorch27", "pytorch28", "pytorch29"} <= set(groups)
    assert set(expand(groups, "sageattn3")) == {
        t.id for t in linux_targets(matrix) if t.package == "sageattn3"
    }
    every = set(parsed["target"])
    for name in groups:
        assert set(expand(groups, name)) <= every, f"group {name} names an unknown target"


def test_variables_are_references_not_literals(matrix):
    raw = parse(BAKE.read_text(encoding="utf-8"), strip=False)
    assert raw["target"]['"_builder"']["args"] == {
        "SAGEBUILD_TORCH_INDEX": "SAGEBUILD_TORCH_INDEX",
        "SOURCE_DATE_EPOCH": "SOURCE_DATE_EPOCH",
    }
    assert raw["target"]['"_linux"']["args"] == {"MANYLINUX_IMAGE": "MANYLINUX_IMAGE"}
    variables = raw["variable"]
    assert variables['"SAGEBUILD_TORCH_INDEX"'] == {"default": '""'}  # configuration, never a literal
    assert variables['"SOURCE_DATE_EPOCH"'] == {"default": '""'}  # the commit's time, given per build


def test_manylinux_image_defaults_to_the_matrix_image(matrix):
    """`docker buildx bake default` needs no MANYLINUX_IMAGE(_<NAME>): each Linux platform's default is
    its image of build-matrix.yaml, the manylinux_2_28 image of its CPU the pinned cibuildwheel uses."""
    variables = parse(BAKE.read_text(encoding="utf-8"))["variable"]
    assert [p.name for p in bake.bake_platforms(matrix)] == ["linux", "linux-aarch64"]
    for platform in bake.bake_platforms(matrix):
        image = platform.manylinux_image
        assert variables[bake.image_variable(matrix, platform.name)] == {"default": image}
        arch = platform.machine
        assert re.fullmatch(rf"[\w.-]+/pypa/manylinux_2_28_{arch}@sha256:[0-9a-f]{{64}}", image)
        require(importlib.util.find_spec("cibuildwheel"), "cibuildwheel")
        assert image == bake.pinned_base_image(platform), (
            f"platforms.{platform.name}.manylinux_image differs from the pinned cibuildwheel's image: "
            f"set it to `python -m sagebuild bake --base-image --platform {platform.name}`"
        )


def test_a_linux_platform_without_an_image_is_refused(matrix):
    data = copy.deepcopy(matrix.raw)
    del data["platforms"]["linux"]["manylinux_image"]
    with pytest.raises(MatrixError, match="platform linux: a Linux platform with repair_platform needs"):
        Matrix(data, root=REPO_ROOT)
    data["platforms"]["linux"]["manylinux_image"] = "example/manylinux_2_28_aarch64:1"
    with pytest.raises(MatrixError, match="is not a manylinux_2_28_x86_64 image"):
        Matrix(data, root=REPO_ROOT)


def test_docker_builds_get_the_commit_time(matrix, capsys, monkeypatch):
    """AC14: the Docker build stamps the wheel with SOURCE_DATE_EPOCH as a native build does: Bake
    passes it, the Dockerfile declares it in the build stage and stops without it, and `bake
    --source-date-epoch` prints the one `sagebuild build` uses."""
    from sagebuild.build import source_date_epoch

    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    assert cli.main(["bake", "--source-date-epoch"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == str(source_date_epoch(REPO_ROOT)[0])
    stages = dockerfile_stages(DOCKERFILE.read_text(encoding="utf-8"))
    build = "\n".join(stages["build"])
    assert re.search(r"^ARG SOURCE_DATE_EPOCH$", build, re.M)
    run = build[build.index("RUN ") :]
    check, call = run.index('test -n "$SOURCE_DATE_EPOCH"'), run.index("-m sagebuild build")
    assert check < call and "sagebuild bake --source-date-epoch" in run[check:call]
    assert "SOURCE_DATE_EPOCH" in parse(BAKE.read_text(encoding="utf-8"))["target"]["_builder"]["args"]


def dockerfile_stages(text: str) -> dict[str, list[str]]:
    stages: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        match = re.match(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.I)
        if match:
            current = match.group(2) or match.group(1)
            stages[current] = [match.group(1)]
        elif current:
            stages[current].append(line)
    return stages


def test_dockerfile_stages_and_arguments(parsed):
    text = DOCKERFILE.read_text(encoding="utf-8")
    stages = dockerfile_stages(text)
    assert list(stages) == ["cuda", "toolchain", "build", "wheel", "test"]
    assert stages["toolchain"][0] == "${MANYLINUX_IMAGE}"
    assert stages["build"][0] == "toolchain" and stages["test"][0] == "toolchain"
    assert stages["wheel"][0] == "scratch"
    build = "\n".join(stages["build"])
    assert re.search(r'-m sagebuild build --target "\$BUILD_ID"', build)
    assert "--repair" in build and '--cuda-home "$CUDA_HOME"' in build
    assert "-m sagebuild verify" in "\n".join(stages["test"])
    declared = set(re.findall(r"^ARG\s+(\w+)", text, re.M))
    passed = set()
    for body in parsed["target"].values():
        passed |= set((body.get("args") or {}).keys())
    assert passed <= declared, f"Bake passes arguments the Dockerfile does not declare: {passed - declared}"
    targets = {body.get("target") for body in parsed["target"].values()} - {None}
    assert targets <= set(stages)


def test_dockerignore_keeps_what_the_build_needs():
    lines = (REPO_ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    ignored = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    for needed in (".github", "sagebuild", "csrc", "sageattention", "setup.py", "pyproject.toml"):
        assert needed not in ignored
    for local in (".git", ".venv*", ".sagebuild", "wheelhouse"):
        assert local in ignored
    assert (REPO_ROOT / ".github" / "sagebuild-requirements.txt").is_file()


def test_no_host_names_in_ci_files():
    files = [BAKE, DOCKERFILE, REPO_ROOT / ".dockerignore", REPO_ROOT / "docs" / "ci.md"]
    files += sorted((REPO_ROOT / ".github").rglob("*.y*ml")) + [
        REPO_ROOT / ".github" / "sagebuild-requirements.txt"
    ]
    files += [REPO_ROOT / "sagebuild" / f"{m}.py" for m in ("bake", "cibw", "ci", "release")]
    # the manylinux images are configuration too: build-matrix.yaml's, rendered into the Bake file
    images = [p.manylinux_image for p in load().platforms.values() if p.manylinux_image]
    for path in files:
        text = path.read_text(encoding="utf-8")
        if path == BAKE:
            for image in images:
                text = text.replace(_q(image), '"IMAGE"')
        match = URL_OR_HOST.search(text)
        assert match is None, f"{path.relative_to(REPO_ROOT)} names {match.group(0)}"


def test_base_image_comes_from_the_pinned_cibuildwheel(capsys):
    require(importlib.util.find_spec("cibuildwheel"), "cibuildwheel")
    assert cli.main(["bake", "--base-image"]) == 0
    image = capsys.readouterr().out.strip()
    assert re.search(r"/manylinux_2_28_x86_64@sha256:[0-9a-f]{64}$", image)
    assert cli.main(["bake", "--base-image", "--platform", "linux-aarch64"]) == 0
    image = capsys.readouterr().out.strip()
    assert re.search(r"/manylinux_2_28_aarch64@sha256:[0-9a-f]{64}$", image)
    assert cli.main(["bake", "--base-image", "--platform", "windows"]) == 2
    assert "not a Linux platform" in capsys.readouterr().err
