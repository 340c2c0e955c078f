"""`sagebuild cibw`: cibuildwheel's own tool reads the generated configuration and lists exactly the
planned identifiers (cibuildwheel --print-build-identifiers needs no Docker and no compiler), and the
options carry the matrix's torch, archs, pins and repair rules.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sagebuild import cibw, cli
from sagebuild.build import AUDITWHEEL_EXCLUDES
from sagebuild.errors import UsageError
from sagebuild.matrix import REPO_ROOT, load


def cibuildwheel_exe() -> str:
    local = Path(sys.executable).parent / "cibuildwheel"
    found = str(local) if local.is_file() else shutil.which("cibuildwheel")
    if found:
        return found
    hint = "cibuildwheel is missing: pip install -r requirements-dev.txt"
    if os.environ.get("SAGE_ALLOW_MISSING_LINTERS") == "1":
        pytest.skip(hint)
    pytest.fail(hint + " (set SAGE_ALLOW_MISSING_LINTERS=1 to skip instead)")


def print_identifiers(platform: str, config: Path | None = None, env: dict | None = None) -> list[str]:
    args = [cibuildwheel_exe(), "--platform", platform, "--print-build-identifiers"]
    if config is not None:
        args += ["--config-file", str(config)]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CIBW_")}
    proc = subprocess.run(
        [*args, "."], cwd=REPO_ROOT, env={**clean, **(env or {})}, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.split()


@pytest.fixture(scope="module")
def matrix():
    return load()


def groups_of(matrix, profile: str, platform: str):
    """A profile's builds grouped the way one cibuildwheel run builds them."""
    out: dict[tuple, list] = {}
    for t in matrix.profile_targets(profile, platform=platform):
        out.setdefault((t.package, t.torch, t.cuda, t.archs), []).append(t)
    return list(out.values())


@pytest.mark.parametrize(
    "profile,platform",
    [("sage2-all", "linux"), ("pytorch26", "windows"), ("default", "windows"), ("ci-build", "linux"),
     ("sage2-all", "linux-aarch64"), ("abi3-release", "linux-aarch64")],
)  # fmt: skip
def test_cibuildwheel_lists_exactly_the_planned_identifiers(matrix, tmp_path, profile, platform):
    planned_all, listed_all = [], []
    for index, targets in enumerate(groups_of(matrix, profile, platform)):
        config = tmp_path / f"cibw-{index}.toml"
        assert cli.main(["cibw", "--format", "toml", "--output", str(config), *[
            a for t in targets for a in ("--target", t.id)
        ]]) == 0  # fmt: skip
        planned = [cibw.identifier(t) for t in targets]
        listed = print_identifiers(matrix.platforms[platform].system.lower(), config)
        assert listed == planned
        planned_all += planned
        listed_all += listed
    assert sorted(listed_all) == sorted(cibw.identifier(t) for t in matrix.profile_targets(profile, platform))


def test_environment_variable_form(matrix):
    target = matrix.find_target("windows-sageattention-pytorch28-cu129-python312")
    env = cibw.as_env(cibw.config_for(matrix, [target]))
    assert print_identifiers("windows", env=env) == ["cp312-win_amd64"]
    assert env["CIBW_BUILD"] == "cp312-win_amd64"
    assert 'TORCH_CUDA_ARCH_LIST="8.0;8.6;8.9;9.0a;12.0a"' in env["CIBW_ENVIRONMENT_WINDOWS"]
    assert 'CUDA_HOME="$CUDA_PATH"' in env["CIBW_ENVIRONMENT_WINDOWS"]
    assert 'SAGEATTENTION_WHEEL="pinned"' in env["CIBW_ENVIRONMENT_WINDOWS"]  # a per-torch target
    assert env["CIBW_BEFORE_BUILD"].startswith("python -m pip install torch==2.8.0 ")
    assert "delvewheel==" in env["CIBW_BEFORE_BUILD"]
    assert env["CIBW_REPAIR_WHEEL_COMMAND_WINDOWS"].startswith("delvewheel repair --no-dll ")
    assert env["CIBW_BUILD_FRONTEND"] == "build; args: --no-isolation"


def test_linux_options(matrix, monkeypatch):
    monkeypatch.setenv("SAGEBUILD_TORCH_INDEX", "file:///srv/torch/{cuda_tag}")
    target = matrix.find_target("linux-sageattention-pytorch28-cu129-python312")
    env = cibw.as_env(cibw.config_for(matrix, [target]))
    assert env["CIBW_MANYLINUX_X86_64_IMAGE"] == "sagebuild-toolchain:cu129"  # docker-bake.hcl's toolchain
    assert 'CUDA_HOME="/usr/local/cuda-12.9"' in env["CIBW_ENVIRONMENT_LINUX"]
    assert "--index-url file:///srv/torch/cu129" in env["CIBW_BEFORE_BUILD"]
    repair = env["CIBW_REPAIR_WHEEL_COMMAND_LINUX"]
    assert repair.startswith("auditwheel repair --plat manylinux_2_28_x86_64 ")
    for pattern in AUDITWHEEL_EXCLUDES:
        assert f"--exclude '{pattern}'" in repair
    for name in ("libtorch", "libc10", "libcudart", "libcuda."):
        assert name in repair


def test_aarch64_options(matrix):
    """linux-aarch64: cibuildwheel's aarch64 identifiers, its toolchain image of docker-bake.hcl and
    the platform's repair policy, all from the matrix."""
    target = matrix.find_target("linux-aarch64-sageattention-abi3-cu130-python312")
    config = cibw.config_for(matrix, [target])
    assert config["platform"] == "linux" and config["identifiers"] == ["cp312-manylinux_aarch64"]
    env = cibw.as_env(config)
    assert env["CIBW_ARCHS_LINUX"] == "aarch64"
    assert env["CIBW_MANYLINUX_AARCH64_IMAGE"] == "sagebuild-toolchain:linux-aarch64-cu130"
    assert env["CIBW_REPAIR_WHEEL_COMMAND_LINUX"].startswith(
        "auditwheel repair --plat manylinux_2_28_aarch64 "
    )
    assert env["CIBW_BEFORE_BUILD"].startswith("python -m pip install torch==2.14.1")
    cu12 = matrix.find_target("linux-aarch64-sageattention-abi3-cu128-python312")
    before = cibw.as_env(cibw.config_for(matrix, [cu12]))["CIBW_BEFORE_BUILD"]
    assert "tag_build = +cu12" in before and " && python -m pip install torch==2.11.0 " in before


def test_per_python_pins_become_overrides(matrix, tmp_path):
    """torch 2.6 spans Python 3.9 (build 1.2.2.post1) and 3.12 (build 1.6.1): cibuildwheel's own option
    reader must give each identifier its pins."""
    cibuildwheel_exe()  # fails (or skips) with the install command when cibuildwheel is missing
    import cibuildwheel.options as options_module

    targets = [
        t for t in matrix.profile_targets("pytorch26", platform="linux") if t.python in ("3.9", "3.12")
    ]
    config = cibw.config_for(matrix, targets)
    path = tmp_path / "cibw.toml"
    path.write_text(cibw.as_toml(config), encoding="utf-8")
    arguments = dataclasses.replace(
        options_module.CommandLineArguments.defaults(),
        platform="linux",
        config_file=str(path),
        package_dir=REPO_ROOT,
    )
    options = options_module.compute_options("linux", arguments, env={})
    old = options.build_options("cp39-manylinux_x86_64")
    new = options.build_options("cp312-manylinux_x86_64")
    assert "build==1.2.2.post1" in old.before_build and "build==1.6.1" in new.before_build
    assert "torch==2.6.0" in old.before_build and "torch==2.6.0" in new.before_build
    assert old.build_frontend.args == ["--no-isolation"]
    with pytest.raises(UsageError):
        cibw.as_env(config)  # overrides have no environment-variable form


def test_sageattn3_local_version_reaches_the_wheel(matrix, tmp_path):
    """The before-build step writes the local-version file where the build backend looks for it: run
    it the way cibuildwheel does (placeholders filled by cibuildwheel's own helper, in the project
    folder), then the `build` frontend on the package folder with the generated environment, on a
    stand-in setuptools project."""
    cibuildwheel_exe()
    from cibuildwheel.util.helpers import prepare_command

    target = matrix.find_target("linux-sageattn3-pytorch29-cu128-python312")
    options = cibw.config_for(matrix, [target])["options"]
    write = options["before-build"].split(" && ")[0]
    assert write.startswith("python -c ") and "{package}" in write

    project = tmp_path / "project"
    package = project / "pkg"
    package.mkdir(parents=True)
    (package / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "demo3"\nversion = "1.0.0"\n\n[tool.setuptools]\npy-modules = ["demo3"]\n',
        encoding="utf-8",
    )
    (package / "demo3.py").write_text("", encoding="utf-8")
    prepared = prepare_command(write, project=project, package=package)
    command = shlex.quote(sys.executable) + prepared[len("python") :]
    subprocess.run(["sh", "-c", command], cwd=project, check=True, timeout=60)
    assert (package / cibw.VERSION_CONFIG).is_file() and not (project / cibw.VERSION_CONFIG).exists()

    env = {**os.environ, "DIST_EXTRA_CONFIG": options["environment"]["DIST_EXTRA_CONFIG"]}
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "build", str(package), "--wheel", "--no-isolation", f"--outdir={out}"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [w.name for w in out.glob("*.whl")] == [f"demo3-1.0.0+{target.local_version}-py3-none-any.whl"]


def test_the_wheel_kind_reaches_setup_py(matrix):
    """setup.py builds the abi3 wheel unless told otherwise: a per-torch target says pinned, as
    `sagebuild build` does."""
    for build_id, kind in (("linux-sageattn3-abi3-cu130-python312", "abi3"),
                           ("linux-sageattn3-pytorch29-cu128-python312", "pinned"),
                           ("linux-sageattention-abi3-cu130-python312", "abi3")):  # fmt: skip
        environment = cibw.config_for(matrix, [matrix.find_target(build_id)])["options"]["environment"]
        assert environment["SAGEATTENTION_WHEEL"] == kind, build_id


def test_one_run_builds_one_combination(matrix):
    a = matrix.find_target("linux-sageattention-pytorch28-cu129-python312")
    b = matrix.find_target("linux-sageattention-pytorch27-cu128-python312")
    with pytest.raises(UsageError, match="one such combination"):
        cibw.config_for(matrix, [a, b])
