"""The real end-to-end build (marker ``build``): the abi3 wheel for sm_90a, built with the machine's
PyTorch 2.14.1 (CUDA 13.0 build) and nvcc 13.0, verified, installed into a fresh venv, and then installed
beside another torch (2.13.0, a CPU build) that pip must leave alone, where the CPU API tests run
against the installed wheel.

Runs ``python -m sagebuild`` exactly as a person would. The build environment (torch and its CUDA
libraries, a few GB) is cached under $SAGEBUILD_CACHE_DIR or .sagebuild/, so only the first run pays
for it. Budget on a 2-core CI machine: about 2-3 minutes for the environment when cold, then the compile
(seconds per kernel file; bindings.cpp includes no torch header).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from sagebuild import build as sagebuild_build
from sagebuild import envs, key_loops
from sagebuild.matrix import REPO_ROOT, load

pytestmark = pytest.mark.build

TARGET = ("--torch", "2.14.1", "--cuda", "13.0", "--python", "3.11", "--archs", "9.0a", "--wheel", "abi3")
WHEEL = "sageattention-2.2.0-cp310-abi3-linux_x86_64.whl"
BUDGET_S = 15 * 60
#: Another torch than the build's, on the machine's disk (a CPU build: no GPU here), the floor's side.
OTHER_TORCH = "torch==2.13.0"
#: The CPU API tests that run against the wheel installed beside it.
API_TESTS = ("tests/conftest.py", "tests/unit/test_api_checks.py", "tests/unit/test_api_fallback.py")


def sagebuild(*args: str, timeout: float = BUDGET_S) -> tuple[subprocess.CompletedProcess, float]:
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "sagebuild", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        # the builds must fix their time stamps themselves
        env={k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"},
    )
    elapsed = time.monotonic() - began
    print(proc.stdout[-6000:])
    print(proc.stderr[-3000:], file=sys.stderr)
    return proc, elapsed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CI build runs on Linux")
def test_real_wheel_build_and_verify(tmp_path):
    out = tmp_path / "wheelhouse"
    proc, build_s = sagebuild("build", *TARGET, "--out", str(out))
    assert proc.returncode == 0, "build failed (output above)"
    wheel = out / WHEEL
    assert wheel.is_file(), sorted(p.name for p in out.iterdir())
    assert "=> OK" in proc.stdout

    with zipfile.ZipFile(wheel) as archive:
        info = json.loads(archive.read("sageattention/_build_info.json"))
        metadata = archive.read("sageattention-2.2.0.dist-info/METADATA").decode()
        names = archive.namelist()
    torch_requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist: torch")]
    assert torch_requires == ["Requires-Dist: torch>=2.6.0"], torch_requires
    assert info["archs"] == ["9.0a"] and info["torch"] == "2.14.1" and info["torch_cuda"] == "13.0"
    assert info["wheel_kind"] == "abi3" and info["cuda_line"] == "13" and info["binding"] == "c-abi"
    planned = load().extension_plan("sageattention", ["9.0a"], REPO_ROOT)
    for plan in planned:
        module = plan.name.replace(".", "/")
        present = any(n.startswith(module + ".") and n.endswith(".so") for n in names)
        assert present == (plan.skipped is None), f"{plan.name}: {plan.skipped or 'expected in the wheel'}"

    # verify again, as a separate step (a fresh venv that borrows the build environment's torch)
    target = load().make_target("sageattention", "linux", "2.14.1", "13.0", "3.11", "9.0a", "abi3")
    cache = sagebuild_build.cache_dir()
    env_python = Path(envs.venv_python(cache / "envs" / f"sageattention-py3.11-torch{target.torch}-cu130"))
    site = envs.site_packages(env_python)
    proc, verify_s = sagebuild(
        "verify", str(wheel), "--expect-archs", "9.0a", "--smoke-torch-site", str(site)
    )
    assert proc.returncode == 0, "verify failed (output above)"
    for line in (
        "✓ abi3 wheel: CUDA 13.x line (the default line, no local version), every torch >= 2.6.0",
        "✓ METADATA: Requires-Dist torch>=2.6.0 (the abi3 floor, never an exact pin)",
        "✓ torch-free sageattention/_qattn_sm90.abi3.so: links no libtorch",
        "✓ abi3 claim: abi3audit finds only limited-API symbols of CPython 3.10",
        "✓ smoke test: fresh venv, import sageattention",
    ):
        assert line in proc.stdout
    if any(p.skipped is None for p in planned):
        assert "✓ SASS sageattention/" in proc.stdout and ": sm_90a" in proc.stdout
    # the wheel's sm_90a key loops are the measured ones when its nvcc is the one that recorded them
    recorded_nvcc = key_loops.load_record(REPO_ROOT)["nvcc"]
    if f"V{info['nvcc']}" == recorded_nvcc:
        assert f"✓ sm_90a key loops: the 12 measured ones ({key_loops.RECORD.as_posix()}" in proc.stdout
    else:
        assert "sm_90a key loops: " in proc.stdout
    print(f"timings: build {build_s:.0f}s, verify {verify_s:.0f}s")
    assert build_s + verify_s < BUDGET_S
    _under_another_torch(wheel, tmp_path)


def _under_another_torch(wheel: Path, tmp_path: Path) -> None:
    """The same wheel file beside torch 2.13.0: pip's resolution keeps that torch (--dry-run --report),
    the install imports, and the CPU API tests pass against the installed package (not the checkout)."""
    venv = tmp_path / "other-torch"
    python = envs.create_venv(sys.executable, venv)
    envs.pip(python, ["install", OTHER_TORCH, "pytest==9.2.0", "hypothesis==6.170.15", "numpy==2.4.1"])
    report = tmp_path / "report.json"
    envs.pip(python, ["install", "--dry-run", "--no-index", "--find-links", str(wheel.parent), "--report",
                      str(report), str(wheel)])  # fmt: skip
    planned = {item["metadata"]["name"] for item in json.loads(report.read_text())["install"]}
    assert planned == {"sageattention"}, f"pip would also install {planned - {'sageattention'}}"
    envs.pip(python, ["install", "--no-index", "--find-links", str(wheel.parent), str(wheel)])
    tests = tmp_path / "api-tests"
    for name in API_TESTS:
        (tests / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / name, tests / name)
    proc = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir",
         str(tests), "-o", "markers=gpu: x", "-m", "not gpu", str(tests / "tests")],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=900, env=envs.clean_env(),
    )  # fmt: skip
    print(proc.stdout[-3000:], proc.stderr[-2000:])
    assert proc.returncode == 0, "the CPU API tests failed beside torch 2.13.0 (output above)"
    where = subprocess.run(
        [str(python), "-c", "import torch, sageattention; print(torch.__version__, sageattention.__file__)"],
        cwd=str(tmp_path), capture_output=True, text=True, env=envs.clean_env(),
    )  # fmt: skip
    assert where.stdout.startswith("2.13.0") and str(venv) in where.stdout, where.stdout + where.stderr
    # Every integration imports from the installed wheel without its client (the venv has neither
    # diffusers nor transformers), and fails only when used, naming the missing package.
    integrations = subprocess.run(
        [str(python), "-c", INTEGRATIONS_CHECK], cwd=str(tmp_path), capture_output=True, text=True,
        env=envs.clean_env(),
    )  # fmt: skip
    assert integrations.returncode == 0, integrations.stdout + integrations.stderr
    lines = integrations.stdout.splitlines()
    assert len(lines) == 5 and all(str(venv) in line for line in lines[:3]), lines
    assert lines[3:] == [f"{client}: needs the {client} package" for client in ("transformers", "diffusers")]


INTEGRATIONS_CHECK = """
import sys
import sageattention.integrations.sdpa as sdpa
import sageattention.integrations.transformers as st
import sageattention.integrations.diffusers as sd
assert "transformers" not in sys.modules and "diffusers" not in sys.modules
for module in (sdpa, st, sd):
    print(module.__file__)
for name, use in (("transformers", st.register), ("diffusers", lambda: sd.sage_processors(object()))):
    try:
        use()
    except ImportError as exc:
        print(f"{name}: needs the {exc.name} package" if f"needs the {name} package" in str(exc) else exc)
"""


def test_pure_python_wheel(tmp_path):
    """The pure-Python wheel, built twice through the real frontend (the second build reuses the
    environment the first made): both verified, and byte-identical (`sagebuild diff`)."""
    wheels = []
    for name in ("first", "second"):
        out = tmp_path / name
        proc, _ = sagebuild("build", "--cpu", "--out", str(out), "--no-smoke", timeout=600)
        assert proc.returncode == 0, "pure build failed (output above)"
        assert "SOURCE_DATE_EPOCH=" in proc.stdout
        wheels.append(out / "sageattention-2.2.0-py3-none-any.whl")
        assert wheels[-1].is_file()
        assert sorted(p.name for p in out.iterdir()) == [wheels[-1].name]
    proc, _ = sagebuild("diff", str(wheels[0]), str(wheels[1]), timeout=60)
    assert proc.returncode == 0 and "✓ byte-identical" in proc.stdout, "two builds of one source differ"
    wheel = wheels[0]
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read("sageattention-2.2.0.dist-info/METADATA").decode()
    assert not [n for n in names if n.endswith((".so", ".pyd"))]
    assert not [n for n in names if n.startswith(("sagebuild/", "tests/", "bench/"))]
    assert "Requires-Dist: torch>=2.4" in metadata
