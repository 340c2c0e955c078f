"""What CI needs from the matrix beyond `plan`: which profiles an event builds, and how a runner gets
the CUDA toolkit for one build.

``python -m sagebuild ci-profiles`` turns a GitHub event into profiles (pull request -> ``default``,
push to main -> ``stable``, tag ``v*`` -> ``sage2-all`` + ``sage3-all`` and a release, manual run -> the
chosen profile). ``python -m sagebuild ci-env --target ID`` says where that build's toolkit comes from.
Both print ``key=value`` lines, ready to append to ``$GITHUB_OUTPUT``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass

from . import envs, tags
from .errors import MatrixError, UsageError
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
    """pip packages where sagebuild can assemble a toolkit from them (Linux, CUDA 13), else the
    installer: CUDA 12 has no nvcc on the package index, and Windows always uses the installer, which
    also registers the MSVC integration."""
    release = toolkit_release(matrix, target.cuda)
    cuda = matrix.cuda_release(target.cuda)
    if target.platform == "windows":
        packages = _WINDOWS_PACKAGES_13 if _vkey(target.cuda) >= (13, 0) else _WINDOWS_PACKAGES_12
        return ToolkitPlan(
            "installer", release, "network", packages, "Windows: the CUDA installer with MSVC integration"
        )
    if cuda.pip.unusable:
        reason = "no nvcc on the package index for CUDA " + target.cuda
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


def _print_outputs(values: dict[str, str]) -> None:
    for key, value in values.items():
        if "\n" in value:
            raise UsageError(f"output {key} would span lines")
        print(f"{key}={value}")


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
    )
    env.add_argument("--target", required=True, help="a build id from `plan`")
    env.set_defaults(func=cmd_ci_env)
