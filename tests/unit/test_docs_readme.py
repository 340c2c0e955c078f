"""README.md and docs/api.md stay true.

* Every command README.md shows (each line of its shell blocks, each inline code span that starts with
  a command) is in exactly one table below: run by CI, with where (``.ci/run`` runs the two
  fresh-machine commands verbatim, this test runs the cheap ones, named tests run the others with the
  same arguments), or not run by CI, with why. A new command fails this test until it is placed.
* README starts with the two fresh-machine commands, and ``.ci/run`` extracts exactly those lines.
* README's usage example runs (on the CPU, with the device and length swapped).
* The signatures docs/api.md shows are the functions' signatures: parameter names, order and defaults.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import shlex
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

import sageattention as sa

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
CI_RUN = (ROOT / ".ci" / "run").read_text(encoding="utf-8")

BUILD_MARKER, TEST_MARKER = "# build and verify the wheel", "# run the tests"
BUILD = "python3 -m pip install -r requirements-dev.txt && python3 -m sagebuild build"
TEST = (
    'python3 -m pip install -q -r requirements-dev.txt && ruff check . && ruff format --check . && '
    'python3 -m pytest -m "not gpu" -q'
)  # fmt: skip

# Run by .ci/run, verbatim (checked by test_ci_runs_the_two_fresh_machine_commands).
BY_CI_RUN = {BUILD: BUILD_MARKER, TEST: TEST_MARKER}
# Run by this test (test_command_runs_here), placeholders filled in.
HERE = (
    "python -m sageattention env",
    "python -m sagebuild which",
    "python -m sagebuild index path/to/wheels",
    "python -m sagebuild which --index path/to/wheels",
    "python -m sagebuild plan --profile stable",
    "python example/NAME.py",
)
# Run by a test of the CPU suite with the same arguments: (file, what in it shows the run).
BY_TESTS = {
    "python -m sagebuild build --torch 2.14.1 --cuda 13.0 --python 3.11 --archs 9.0a --wheel abi3": (
        "tests/build/test_wheel_build.py",
        'TARGET = ("--torch", "2.14.1", "--cuda", "13.0", "--python", "3.11", "--archs", "9.0a", '
        '"--wheel", "abi3")',
    ),
    # The README build command ends with this verification of the wheel it leaves in wheelhouse/ too.
    "python -m sagebuild verify wheelhouse/*.whl": (
        "tests/build/test_wheel_build.py",
        '"verify", str(wheel)',
    ),
    "python -m sagebuild build --cpu": ("tests/build/test_wheel_build.py", '"build", "--cpu"'),
    "python -m sageattention run script.py": (
        "tests/unit/test_integrations_run.py",
        '"-m", "sageattention", "run", str(script)',
    ),
    "python -m sagebuild diff A B": (
        "tests/build/test_wheel_build.py",
        '"diff", str(wheels[0]), str(wheels[1])',
    ),
}
_GPU = "needs a CUDA GPU; CI has none (on the GPU machine: bench/device_run.sh)"
_INSTALLS = (
    "installs into the environment it runs in, torch included (gigabytes); CI builds the package through "
    "the same setup.py with sagebuild: the README build command (CUDA) and `sagebuild build --cpu` (pure)"
)
NOT_IN_CI = {
    "python3 -m pytest -m gpu": _GPU,
    "python3 -m pytest -m gpu tests/gpu/test_integration.py": _GPU,
    "python bench/bench_attention.py": _GPU,
    "python bench/accuracy.py": _GPU,
    "python -m sageattn3 selftest": "needs an installed sageattn3 wheel and a GPU; its CPU tests run in CI "
    "(sageattention3_blackwell/tests)",
    "python -m sagebuild build --target linux-sageattention-pytorch28-cu129-python312 --cuda-home "
    "/usr/local/cuda-12.9": "needs a CUDA 12.9 toolkit at that path; CI's machine has CUDA 13.0 "
    "(GitHub's build workflows build this target: docs/ci.md)",
    "pip install torch": _INSTALLS,
    "pip install .": _INSTALLS,
    "pip install --no-build-isolation .": _INSTALLS,
    "SAGEATTENTION_BUILD_CUDA=0 pip install .": _INSTALLS,
}

_COMMAND = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:python3?|pip|pytest|ruff|bash|docker|cibuildwheel)\s")


def readme_commands() -> list[str]:
    """Each command of README.md once, in order: shell-block lines (comments dropped) and inline spans."""
    found = []
    for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", README, re.M | re.S):
        if lang in ("bash", "sh", "shell"):
            for line in body.splitlines():
                line = re.sub(r"\s+#\s.*$", "", line).strip()
                if line and not line.startswith("#"):
                    found.append(line)
    prose = re.sub(r"^```.*?^```", "", README, flags=re.M | re.S)
    for span in re.findall(r"(`+)(.+?)\1", prose, re.S):
        text = " ".join(span[1].split())
        if _COMMAND.match(text + " "):
            found.append(text)
    return list(dict.fromkeys(found))


def test_every_readme_command_is_placed_exactly_once():
    tables = [set(BY_CI_RUN), set(HERE), set(BY_TESTS), set(NOT_IN_CI)]
    placed = set().union(*tables)
    assert sum(len(t) for t in tables) == len(placed), "a command is in two tables"
    commands = readme_commands()
    missing = [c for c in commands if c not in placed]
    assert not missing, (
        f"README.md shows commands this test does not place: {missing}. Add each to one table of "
        "tests/unit/test_docs_readme.py: run by CI (and where), or not, and why."
    )
    stale = sorted(placed - set(commands))
    assert not stale, f"commands no longer in README.md: {stale}; remove them from the tables"


def test_readme_starts_with_the_two_fresh_machine_commands():
    first_block = re.search(r"^```bash\n(.*?)^```", README, re.M | re.S).group(1).splitlines()
    assert first_block[0].startswith(BUILD_MARKER) and first_block[1] == BUILD
    assert first_block[2].startswith(TEST_MARKER) and first_block[3] == TEST


def test_ci_runs_the_two_fresh_machine_commands():
    """.ci/run's own extraction, run on README.md, gives the two lines, build first."""
    function = re.search(r"^readme_command\(\) \{.*?^\}", CI_RUN, re.M | re.S).group(0)
    assert f'for marker in "{BUILD_MARKER}" "{TEST_MARKER}"; do' in CI_RUN
    assert 'bash -euo pipefail -c "$command"' in CI_RUN
    for command, marker in BY_CI_RUN.items():
        script = f"{function}\nreadme_command {shlex.quote(marker)}"
        out = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == command


@pytest.mark.parametrize("command", sorted(BY_TESTS))
def test_command_is_run_by_a_test_with_the_same_arguments(command):
    path, evidence = BY_TESTS[command]
    assert evidence in (ROOT / path).read_text(encoding="utf-8"), f"{path} no longer runs `{command}`"


@pytest.mark.parametrize("command", sorted(NOT_IN_CI))
def test_commands_ci_cannot_run_name_existing_files(command):
    for word in command.split():
        if word.endswith(".py"):
            assert (ROOT / word).is_file(), word


def _run(command: str, cwd=ROOT, timeout=300) -> subprocess.CompletedProcess:
    argv = shlex.split(command)
    argv[0] = sys.executable  # `python` of the README: the interpreter running the tests
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert out.returncode == 0, f"`{command}` failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def _stand_in_wheel(folder: Path, name: str) -> None:
    """A wheel of that name that sagebuild index accepts (METADATA, WHEEL and RECORD; no code)."""
    from wheel.wheelfile import WheelFile

    project, version, build, tag = name[: -len(".whl")].split("-", 3)
    folder.mkdir(parents=True, exist_ok=True)
    with WheelFile(str(folder / name), "w") as archive:
        archive.writestr(f"{project}/__init__.py", "")
        meta = f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n"
        torch_version = torch.__version__.split("+")[0]
        archive.writestr(
            f"{archive.dist_info_path}/METADATA", meta + f"Requires-Dist: torch=={torch_version}\n\n"
        )
        purelib = str(tag == "py3-none-any").lower()
        info = (
            f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: {purelib}\nTag: {tag}\nBuild: {build}\n"
        )
        archive.writestr(f"{archive.dist_info_path}/WHEEL", info)


@pytest.mark.parametrize("command", HERE)
def test_command_runs_here(command, tmp_path):
    if command == "python example/NAME.py":
        clients = {"sdpa_monkeypatch": "torch", "diffusers_backend": "diffusers"}
        clients["transformers_attention"] = "transformers"
        for name in [name for name, client in clients.items() if _importable(client)]:
            out = _run(command.replace("NAME", name), timeout=600)
            assert "device: " in out.stdout and "cos" in out.stdout
        return
    if "path/to/wheels" in command:
        # A folder holding a stand-in for the wheel `which` names for this environment.
        wheel = re.search(r"^wheel:\s+(\S+)", _run("python -m sagebuild which").stdout, re.M).group(1)
        folder = tmp_path / "wheels"
        _stand_in_wheel(folder, wheel)
        assert zipfile.is_zipfile(folder / wheel)
        _run(f"python -m sagebuild index {folder}")
        if "which" in command:
            out = _run(f"python -m sagebuild which --index {folder}")
            assert wheel in out.stdout and "pip install --index-url" in out.stdout
        return
    out = _run(command)
    assert out.stdout.strip()


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_usage_example_runs_on_the_cpu():
    """README's first Python block, with device "cpu" and a shorter sequence (the fallback runs SDPA)."""
    code = re.search(r"^```python\n(.*?)^```", README, re.M | re.S).group(1)
    assert 'device="cuda"' in code and "4608" in code
    code = code.replace('device="cuda"', 'device="cpu"').replace("4608", "64")
    scope: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sa.SageAttentionFallbackWarning)
        exec(compile(code, "README.md", "exec"), scope)
    assert scope["out"].shape == (1, 24, 64, 128) and scope["lse"].shape == (1, 24, 64)


# --------------------------------------------------------------------------------------------------
# docs/api.md signatures

API = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
PUBLIC = [getattr(sa, n) for n in sa.__all__ if inspect.isfunction(getattr(sa, n))]


def _documented_signature(name: str) -> list[tuple[str, object]]:
    """(name, default) of each parameter of ``name(...)`` as shown in a python block of docs/api.md."""
    blocks = "\n".join(re.findall(r"^```python\n(.*?)^```", API, re.M | re.S))
    match = re.search(rf"^{name}\((.*?)\)$", blocks, re.M | re.S)
    assert match, f"docs/api.md shows no signature of {name}"
    args = ast.parse(f"def f({match.group(1)}): pass").body[0].args
    names = [a.arg for a in args.args]
    defaults = [ast.literal_eval(d) for d in args.defaults]
    out = [(n, inspect.Parameter.empty) for n in names[: len(names) - len(defaults)]]
    out += list(zip(names[len(names) - len(defaults) :], defaults))
    if args.kwarg:
        out.append((f"**{args.kwarg.arg}", inspect.Parameter.empty))
    return out


@pytest.mark.parametrize("fn", PUBLIC, ids=lambda f: f.__name__)
def test_api_md_signature_is_the_functions_signature(fn):
    actual = [
        (f"**{p.name}" if p.kind is p.VAR_KEYWORD else p.name, p.default)
        for p in inspect.signature(fn).parameters.values()
    ]
    assert _documented_signature(fn.__name__) == actual
