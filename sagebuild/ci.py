"""What CI needs from the matrix beyond `plan`: which profiles an event builds, and how a runner gets
the CUDA toolkit for one build.

``python -m sagebuild ci-profiles`` turns a GitHub event into profiles (pull request -> ``default``,
push to main -> ``stable``, tag ``v*`` -> ``sage2-all`` + ``sage3-all`` and a release, manual run -> the
chosen profile). ``python -m sagebuild ci-env --target ID`` says where that build's toolkit comes from.
``python -m sagebuild ci-msvc`` checks, on a Windows runner, that the image's MSVC is one the installed
CUDA toolkit accepts. All three print ``key=value`` lines, ready to append to ``$GITHUB_OUTPUT``.
``ci-result`` and ``ci-summary`` make the build summary: a table of every build and its result.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import envs, tags
from .errors import MatrixError, SagebuildError, UsageError
from .matrix import Matrix, Target

# The trigger -> profile policy of the CI/CD documentation (seed 003), plus the sageattn3 set (seed 000).
PULL_REQUEST_PROFILES = ("default",)
MAIN_BRANCH = "refs/heads/main"
MAIN_PROFILES = ("stable",)
RELEASE_TAG_PREFIX = "refs/tags/v"
RELEASE_PROFILES = ("sage2-all", "sage3-all")

# Full toolkit releases for the CUDA minor versions of the matrix: what an installer (the setup action on
# a runner, the nvidia/cuda image in Docker) needs, since both want X.Y.Z. A `toolkit_release` key under
# the CUDA's entry in build-matrix.yaml takes precedence, so a new CUDA needs no edit here.
DEFAULT_TOOLKIT_RELEASES = {
    "12.4": "12.4.1",
    "12.6": "12.6.3",
    "12.8": "12.8.1",
    "12.9": "12.9.1",
    "13.0": "13.0.0",
    "13.1": "13.1.0",
}

# Components the installers put down: the compiler, the runtime with its headers and (apt) the C++
# core library headers. CUDA 13 split the front end (crt) and NVVM out of the nvcc package.
_LINUX_APT_PACKAGES = ("nvcc", "cudart-dev", "cccl")
_WINDOWS_PACKAGES_12 = ("nvcc", "cudart", "visual_studio_integration")
_WINDOWS_PACKAGES_13 = ("nvcc", "crt", "nvvm", "cudart", "visual_studio_integration")


def toolkit_release(matrix: Matrix, cuda: str) -> str:
    """X.Y.Z of the CUDA toolkit an installer puts down for CUDA X.Y."""
    matrix.cuda_release(cuda)
    entry = (matrix.raw.get("cuda") or {}).get(cuda) or {}
    release = entry.get("toolkit_release") or DEFAULT_TOOLKIT_RELEASES.get(cuda)
    if not release:
        raise MatrixError(
            f'CUDA {cuda}: no toolkit release known; add `toolkit_release: "{cuda}.N"` under cuda: '
            f'"{cuda}" in build-matrix.yaml (the X.Y.Z that the CUDA installer and images use)'
        )
    release = str(release)
    if not release.startswith(cuda + "."):
        raise MatrixError(f"CUDA {cuda}: toolkit_release {release!r} is not a {cuda}.N release")
    return release


def _vkey(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


@dataclass(frozen=True)
class ToolkitPlan:
    """How a CI runner gets the CUDA toolkit for one build."""

    source: str  # "pip": sagebuild installs it from pip packages | "installer": the setup action
    release: str  # X.Y.Z
    method: str  # the setup action's install method
    sub_packages: tuple[str, ...]
    reason: str

    def outputs(self) -> dict[str, str]:
        return {
            "toolkit": self.source,
            "cuda-release": self.release,
            "cuda-method": self.method,
            "cuda-sub-packages": json.dumps(list(self.sub_packages)),
            "toolkit-reason": self.reason,
        }


def toolkit_plan(matrix: Matrix, target: Target) -> ToolkitPlan:
    """pip packages where sagebuild can assemble a toolkit from them (Linux, CUDA 13, a platform
    whose wheels the packages have: ``pip: platforms``), else the installer: CUDA 12 has no nvcc on
    the package index, and Windows always uses the installer, which also registers the MSVC
    integration."""
    release = toolkit_release(matrix, target.cuda)
    cuda = matrix.cuda_release(target.cuda)
    if matrix.platform(target.platform).system == "Windows":
        packages = _WINDOWS_PACKAGES_13 if _vkey(target.cuda) >= (13, 0) else _WINDOWS_PACKAGES_12
        return ToolkitPlan(
            "installer", release, "network", packages, "Windows: the CUDA installer with MSVC integration"
        )
    reason = None
    if cuda.pip.unusable:
        reason = "no nvcc on the package index for CUDA " + target.cuda
    elif not cuda.pip.serves(target.platform):
        reason = f"no CUDA {target.cuda} toolkit packages for {target.platform} on the package index"
    if reason:
        return ToolkitPlan("installer", release, "network", _LINUX_APT_PACKAGES, reason)
    return ToolkitPlan("pip", release, "network", (), "sagebuild installs the pip toolkit packages")


def event_profiles(matrix: Matrix, event: str, ref: str, requested: str = "") -> tuple[list[str], bool]:
    """(profiles to build, whether to publish a release) for a GitHub event."""
    requested = requested.strip()
    if event == "workflow_dispatch":
        if not requested:
            raise UsageError("a manual run needs a profile")
        profiles, release = [requested], False
    elif event == "pull_request":
        profiles, release = list(PULL_REQUEST_PROFILES), False
    elif event == "push" and ref == MAIN_BRANCH:
        profiles, release = list(MAIN_PROFILES), False
    elif event == "push" and ref.startswith(RELEASE_TAG_PREFIX):
        profiles, release = list(RELEASE_PROFILES), True
    else:
        raise UsageError(
            f"no profile for event {event!r} on {ref!r}: CI builds pull requests, pushes to main, "
            "tags v* and manual runs"
        )
    for name in profiles:
        if name not in matrix.profiles:
            raise UsageError(f"unknown profile {name!r}; valid profiles: {', '.join(matrix.profiles)}")
    return profiles, release


def profiles_by_package(matrix: Matrix, profiles: Sequence[str]) -> dict[str, str]:
    """package -> profile ('' for a package that nothing builds); one profile per package."""
    chosen = {name: "" for name in matrix.packages}
    for profile in profiles:
        package = matrix.sets[matrix.profiles[profile].set]["package"]
        if chosen[package]:
            raise UsageError(f"profiles {chosen[package]} and {profile} both build {package}")
        chosen[package] = profile
    return chosen


# ----------------------------------------------------------------------------------------------------
# MSVC on Windows runners
#
# nvcc refuses a host compiler whose _MSC_VER lies outside the range in its include/crt/host_config.h
# (CUDA 13.0's accepts 1920-1949: Visual Studio 2019 and 2022), and a runner image update can move the
# default MSVC toolset past it (Visual Studio 2026 is 1950). torch's extension builder loads the
# environment (vcvars) of the newest Visual Studio that vswhere reports, whose default toolset is named
# in VC/Auxiliary/Build/Microsoft.VCToolsVersion.default.txt. Reading both files before the build turns
# a failure deep inside the compile into one line with the numbers.

VC_TOOLS_COMPONENT = "Microsoft.VisualStudio.Component.VC.Tools.x86.x64"
_MSC_GUARD = re.compile(r"_MSC_VER\s*<\s*(\d+)\s*\|\|\s*_MSC_VER\s*>=\s*(\d+)")
_MSVC_REFUSAL = "unsupported Microsoft Visual Studio version"


def msc_ver(toolset: str) -> int:
    """_MSC_VER of an MSVC toolset: 14.XY compiles as 19XY (14.16 -> 1916, 14.44 -> 1944, 14.50 -> 1950)."""
    parts = toolset.strip().split(".")
    if len(parts) < 2 or parts[0] != "14" or not parts[1].isdigit() or len(parts[1]) > 2:
        raise SagebuildError(f"MSVC toolset {toolset!r}: expected a version 14.XY[.Z]")
    return 1900 + int(parts[1])


def cuda_msc_range(host_config: str) -> tuple[int, int]:
    """[low, high) of the _MSC_VER values nvcc accepts, from the text of its crt/host_config.h: the
    last ``_MSC_VER < low || _MSC_VER >= high`` guard before the refusal message."""
    refusal = host_config.find(_MSVC_REFUSAL)
    guards = [m for m in _MSC_GUARD.finditer(host_config) if refusal < 0 or m.start() < refusal]
    if not guards:
        raise SagebuildError(
            "crt/host_config.h has no `_MSC_VER < N || _MSC_VER >= M` guard: cannot tell which MSVC "
            "this nvcc accepts"
        )
    return int(guards[-1].group(1)), int(guards[-1].group(2))


def find_visual_studio() -> Path:
    """The installation that setuptools (and so torch's extension builder) uses: vswhere's newest one
    with the x64 C++ tools."""
    program_files = os.environ.get("ProgramFiles(x86)") or r"C:\Program Files (x86)"
    vswhere = Path(program_files) / "Microsoft Visual Studio" / "Installer" / "vswhere.exe"
    if not vswhere.is_file():
        raise SagebuildError(f"{vswhere} not found: is Visual Studio with the C++ tools installed?")
    args = [str(vswhere), "-latest", "-prerelease", "-products", "*", "-requires", VC_TOOLS_COMPONENT]
    proc = subprocess.run(
        [*args, "-property", "installationPath"], capture_output=True, text=True, timeout=120, check=False
    )
    found = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not found:
        detail = proc.stderr.strip() or f"exit code {proc.returncode}"
        raise SagebuildError(f"vswhere found no Visual Studio with {VC_TOOLS_COMPONENT} ({detail})")
    return Path(found[0].strip())


def check_msvc(cuda_home: Path, vs_root: Path) -> dict[str, str]:
    """Outputs for a Visual Studio whose default MSVC the toolkit at cuda_home accepts; else an error
    that says what to change."""
    header = cuda_home / "include" / "crt" / "host_config.h"
    default = vs_root / "VC" / "Auxiliary" / "Build" / "Microsoft.VCToolsVersion.default.txt"
    for path in (header, default):
        if not path.is_file():
            raise SagebuildError(f"{path} not found")
    low, high = cuda_msc_range(header.read_text(encoding="utf-8", errors="replace"))
    toolset = default.read_text(encoding="utf-8").strip()
    version = msc_ver(toolset)
    if not low <= version < high:
        raise SagebuildError(
            f"MSVC {toolset} (_MSC_VER {version}, {vs_root}) is outside what the nvcc of {cuda_home} "
            f"accepts (_MSC_VER {low}-{high - 1}): pin platforms.windows.runner in build-matrix.yaml to "
            "an image whose Visual Studio this CUDA accepts, or leave this CUDA out of the Windows builds"
        )
    return {
        "msvc-toolset": toolset,
        "msc-ver": str(version),
        "cuda-msc-range": f"{low}-{high - 1}",
        "visual-studio": str(vs_root),
    }


def _print_outputs(values: dict[str, str]) -> None:
    for key, value in values.items():
        if "\n" in value:
            raise UsageError(f"output {key} would span lines")
        print(f"{key}={value}")


# ----------------------------------------------------------------------------------------------------
# The build summary (seed 003's build-summary job): every planned build and its result, as a table
#
# Each build job ends, whatever happened, with ``ci-result``: a small JSON file with its build id, the
# job's status and the wheel it made, uploaded as artifact ``result-<build id>``. The summary job
# downloads them all and ``ci-summary`` lists the plan from the matrix (the same builds `plan --system`
# gave the job matrix), each with its result; a build without a result file is "no result" (its job
# never ran, or stopped before reporting).

RESULT_ARTIFACT_PREFIX = "result-"
RESULT_LABELS = {
    "success": "✅ success",
    "failure": "❌ failure",
    "cancelled": "⚪ cancelled",
    "skipped": "⚪ skipped",
}
NO_RESULT = "⚠️ no result"


def system_targets(matrix: Matrix, profile: str, package: str | None, system: str) -> list[Target]:
    """The builds of a profile (and package) on every platform of a system: one build workflow's plan."""
    if profile not in matrix.profiles:
        raise UsageError(f"unknown profile {profile!r}; valid profiles: {', '.join(matrix.profiles)}")
    systems = {p.system for p in matrix.platforms.values()}
    if system not in systems:
        raise UsageError(f"unknown system {system!r}; the matrix's systems: {', '.join(sorted(systems))}")
    targets = matrix.profile_targets(profile, package=package)
    return [t for t in targets if matrix.platforms[t.platform].system == system]


def write_result(matrix: Matrix, build_id: str, status: str, dist: Path | None, out: Path) -> Path:
    """``out/<build id>.json``: the job's status and the wheels it left in ``dist``."""
    target = matrix.find_target(build_id)
    status = status.strip().lower()
    if status not in RESULT_LABELS:
        raise UsageError(f"job status {status!r}: expected one of {', '.join(RESULT_LABELS)}")
    wheels = sorted(p.name for p in dist.glob("*.whl")) if dist is not None and dist.is_dir() else []
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{target.id}.json"
    record = {"id": target.id, "result": status, "wheels": wheels}
    path.write_text(json.dumps(record, sort_keys=True) + "\n", encoding="utf-8")
    return path


def read_results(folder: Path | None) -> dict[str, dict]:
    """Build id -> result record, from the ``*.json`` files under ``folder`` (any depth: one folder per
    artifact or all merged)."""
    results: dict[str, dict] = {}
    if folder is None or not folder.is_dir():
        return results
    for path in sorted(folder.rglob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("id"), str):
            results[record["id"]] = record
    return results


def render_summary(
    matrix: Matrix, profile: str, package: str | None, system: str, results_dir: Path | None
) -> str:
    """Markdown for $GITHUB_STEP_SUMMARY: one row per planned build with its versions and result."""
    targets = system_targets(matrix, profile, package, system)
    results = read_results(results_dir)
    counts: dict[str, int] = {}
    rows = []
    for target in targets:
        record = results.get(target.id)
        status = record.get("result") if record else None
        label = RESULT_LABELS.get(status or "", NO_RESULT)
        counts[label] = counts.get(label, 0) + 1
        made = (record or {}).get("wheels") or []
        wheel = ", ".join(f"`{w}`" for w in made) if made else f"`{target.wheel_name}` (planned)"
        cells = [f"`{target.id}`", target.torch, target.cuda, target.python, target.arch_list, wheel, label]
        rows.append("| " + " | ".join(cells) + " |")
    what = f"{package or 'every package'}, profile `{profile}`, {system}"
    lines = [f"### Build summary: {what}", ""]
    if not targets:
        lines.append(f"No builds: profile `{profile}` has none for {package or 'any package'} on {system}.")
        return "\n".join(lines) + "\n"
    tally = ", ".join(f"{n} {label}" for label, n in counts.items())
    lines += [f"{len(targets)} builds: {tally}", ""]
    lines += ["| build | PyTorch | CUDA | Python | archs | wheel | result |", "|---|---|---|---|---|---|---|"]
    lines += rows
    unplanned = sorted(set(results) - {t.id for t in targets})
    if unplanned:
        lines += [
            "",
            "Results for builds that are not in this plan: " + ", ".join(f"`{i}`" for i in unplanned),
        ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------
# command line


def cmd_ci_profiles(args: argparse.Namespace) -> int:
    matrix = Matrix.load(args.matrix)
    profiles, release = event_profiles(matrix, args.event, args.ref, args.profile or "")
    values = dict(profiles_by_package(matrix, profiles))
    values["profiles"] = " ".join(profiles)
    values["release"] = "true" if release else "false"
    _print_outputs(values)
    return 0


def cmd_ci_env(args: argparse.Namespace) -> int:
    matrix = Matrix.load(args.matrix)
    target = matrix.find_target(args.target)
    plan = toolkit_plan(matrix, target)
    values = {"id": target.id, "platform": target.platform, "python": target.python}
    values.update(plan.outputs())
    # SAGEBUILD_TORCH_INDEX expanded for this build's CUDA (empty: pip's configured index)
    values["torch-index"] = envs.torch_index(tags.cuda_tag(target.cuda)) or ""
    _print_outputs(values)
    return 0


def cmd_ci_result(args: argparse.Namespace) -> int:
    matrix = Matrix.load(args.matrix)
    path = write_result(
        matrix, args.target, args.status, Path(args.dist) if args.dist else None, Path(args.out)
    )
    print(f"wrote {path}")
    return 0


def cmd_ci_summary(args: argparse.Namespace) -> int:
    matrix = Matrix.load(args.matrix)
    results = Path(args.results) if args.results else None
    print(render_summary(matrix, args.profile, args.package or None, args.system, results), end="")
    return 0


def cmd_ci_msvc(args: argparse.Namespace) -> int:
    cuda_home = args.cuda_home or os.environ.get("CUDA_PATH") or os.environ.get("CUDA_HOME")
    if not cuda_home:
        raise UsageError("give --cuda-home (or set CUDA_PATH): the CUDA toolkit the build will use")
    vs_root = Path(args.visual_studio) if args.visual_studio else find_visual_studio()
    _print_outputs(check_msvc(Path(cuda_home), vs_root))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    profiles = sub.add_parser(
        "ci-profiles",
        help="CI: the profiles a GitHub event builds (key=value lines for $GITHUB_OUTPUT)",
        description="pull_request -> default; push to main -> stable; tag v* -> sage2-all and sage3-all "
        "plus a release; workflow_dispatch -> --profile.",
    )
    profiles.add_argument("--event", required=True, help="github.event_name")
    profiles.add_argument("--ref", default="", help="github.ref")
    profiles.add_argument("--profile", default="", help="the profile of a manual run")
    profiles.set_defaults(func=cmd_ci_profiles)

    env = sub.add_parser(
        "ci-env",
        help="CI: where one build's CUDA toolkit comes from (key=value lines for $GITHUB_OUTPUT)",
        description="For one build id: whether its CUDA toolkit comes from pip packages (sagebuild "
        "installs them) or from the CUDA installer (release, method, sub-packages), why, and the torch "
        "index SAGEBUILD_TORCH_INDEX gives for its CUDA.",
    )
    env.add_argument("--target", required=True, help="a build id from `plan`")
    env.set_defaults(func=cmd_ci_env)

    result = sub.add_parser(
        "ci-result",
        help="CI: record one build job's result for the build summary",
        description="Write OUT/<build id>.json with the job's status (success, failure, cancelled) and "
        "the wheels in --dist; the build job uploads it, whatever happened, for `ci-summary`.",
    )
    result.add_argument("--target", required=True, help="the build id of the job")
    result.add_argument("--status", required=True, help="the job's status (job.status)")
    result.add_argument("--dist", help="the folder the job's wheels went to")
    result.add_argument("--out", required=True, help="folder to write the result file into")
    result.set_defaults(func=cmd_ci_result)

    summary = sub.add_parser(
        "ci-summary",
        help="CI: a Markdown table of every build of a plan and its result (for $GITHUB_STEP_SUMMARY)",
        description="List the builds of --profile (and --package) on the platforms of --system, as `plan "
        "--system` gives them to the build jobs, with torch, CUDA, Python, archs, the wheel and the "
        "result each job recorded with `ci-result` (found under --results); a build without one is "
        "shown as having no result.",
    )
    summary.add_argument("--profile", required=True, help="the profile the workflow built")
    summary.add_argument("--package", default="", help="the package the workflow built (default: every one)")
    summary.add_argument(
        "--system", required=True, help="the system of the workflow's platforms (Linux, Windows)"
    )
    summary.add_argument("--results", help="folder holding the result files (missing: no results)")
    summary.set_defaults(func=cmd_ci_summary)

    msvc = sub.add_parser(
        "ci-msvc",
        help="CI (Windows): check that the default MSVC is one this CUDA toolkit's nvcc accepts",
        description="Reads the _MSC_VER range from CUDA_HOME/include/crt/host_config.h and the default "
        "MSVC toolset of the Visual Studio that vswhere reports (the one torch's builder loads).",
    )
    msvc.add_argument("--cuda-home", help="the CUDA toolkit (default: $CUDA_PATH, then $CUDA_HOME)")
    msvc.add_argument("--visual-studio", help="a Visual Studio installation folder (default: vswhere's)")
    msvc.set_defaults(func=cmd_ci_msvc)
