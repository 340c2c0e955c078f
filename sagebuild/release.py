"""``sagebuild release-check``: the gate in front of a GitHub Release.

Before anything is published, the downloaded build artifacts must be exactly the planned set: one wheel
per planned build of the release profiles (every platform), each named as planned, no name twice, no
stray file, the tag matching the package version, and no name that the release already holds (assets
are never overwritten). On success it can gather the wheels into one folder and write SHA256SUMS.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import envs
from .errors import SagebuildError, TagError, UsageError
from .matrix import Matrix, Target

ARTIFACT_PREFIX = "wheels-"
SUMS_FILE = "SHA256SUMS"


@dataclass
class ReleaseReport:
    planned: int = 0
    wheels: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def render(self) -> str:
        lines = [f"release check: {len(self.wheels)} wheels found, {self.planned} planned"]
        lines += [f"  ✓ {note}" for note in self.notes]
        lines += [f"  ✗ {problem}" for problem in self.problems]
        lines.append("  release check passed" if self.passed else f"  {len(self.problems)} problem(s)")
        return "\n".join(lines)


def planned_targets(matrix: Matrix, profiles: Sequence[str]) -> list[Target]:
    """Every build of the profiles on every platform they name, each wheel once."""
    seen: dict[str, Target] = {}
    for profile in profiles:
        if profile not in matrix.profiles:
            raise UsageError(f"unknown profile {profile!r}; valid profiles: {', '.join(matrix.profiles)}")
        for target in matrix.profile_targets(profile):
            seen.setdefault(target.wheel_name, target)
    return list(seen.values())


def accepted_names(matrix: Matrix, target: Target) -> set[str]:
    """The planned file name, and on a platform whose wheels may be repaired, the repaired one."""
    names = {target.wheel_name}
    repaired = matrix.platforms[target.platform].repair_platform
    if repaired:
        names.add(target.wheel_name[: -len(target.wheel_platform + ".whl")] + repaired + ".whl")
    return names


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def check_release(
    matrix: Matrix,
    root: Path,
    profiles: Sequence[str],
    tag: str | None = None,
    tag_package: str = "sageattention",
    existing: Iterable[str] = (),
    also_published: Sequence[str] = (),
) -> ReleaseReport:
    """``also_published``: names of the other files the release will get (SHA256SUMS), held to the
    same never-replace rule as the wheels."""
    report = ReleaseReport()
    if not root.is_dir():
        raise UsageError(f"{root} is not a folder")
    targets = planned_targets(matrix, profiles)
    report.planned = len(targets)
    by_id = {target.id: target for target in targets}
    by_name: dict[str, Target] = {}
    for target in targets:
        for name in accepted_names(matrix, target):
            by_name[name] = target

    if tag is not None:
        version = matrix.package_version(tag_package)
        if tag != f"v{version}":
            report.problems.append(
                f"tag {tag} does not match {tag_package} {version}: tag v{version}, or bump the version"
            )
        else:
            report.notes.append(f"tag {tag} matches {tag_package} {version}")

    found: dict[str, list[Path]] = {}
    for path in _files(root):
        if path.suffix != ".whl":
            report.problems.append(f"{path.relative_to(root)}: not a wheel (only wheels are published)")
            continue
        found.setdefault(path.name, []).append(path)
    for name, paths in sorted(found.items()):
        if len(paths) > 1:
            where = ", ".join(str(p.relative_to(root)) for p in paths)
            report.problems.append(f"{name} comes from {len(paths)} artifacts ({where})")
    report.wheels = [paths[0] for _, paths in sorted(found.items())]

    built: dict[str, str] = {}  # planned wheel name -> file found
    for path in report.wheels:
        name = path.name
        try:
            matrix.parse_wheel_name(name)
        except TagError as exc:
            report.problems.append(str(exc))
            continue
        target = by_name.get(name)
        if target is None:
            report.problems.append(f"{name}: not a build of {' + '.join(profiles)}")
            continue
        if target.wheel_name in built:
            report.problems.append(f"{name} and {built[target.wheel_name]} are the same build ({target.id})")
            continue
        built[target.wheel_name] = name
        artifact = path.parent.name
        if path.parent != root and artifact.startswith(ARTIFACT_PREFIX):
            build_id = artifact[len(ARTIFACT_PREFIX) :]
            expected = by_id.get(build_id)
            if expected is None:
                try:
                    expected = matrix.find_target(build_id)
                except SagebuildError:
                    report.problems.append(f"artifact {artifact}: {build_id} is not a build id")
                    continue
            if name not in accepted_names(matrix, expected):
                report.problems.append(f"artifact {artifact} holds {name}, expected {expected.wheel_name}")

    missing = [t for t in targets if t.wheel_name not in built]
    for target in missing:
        report.problems.append(f"missing: {target.wheel_name} ({target.id})")
    if not missing and len(built) == len(targets):
        report.notes.append(f"all {len(targets)} planned wheels present, each once, named as planned")

    publishing = {p.name for p in report.wheels} | set(also_published)
    clash = sorted(publishing & {e.strip() for e in existing if e.strip()})
    for name in clash:
        report.problems.append(f"{name} is already a release asset: assets are never replaced")
    if existing and not clash:
        report.notes.append("no name collides with an asset already on the release")
    return report


def sums_text(wheels: Sequence[Path]) -> str:
    """``sha256sum`` format (two spaces, binary-safe names), sorted by file name."""
    return "".join(f"{envs.file_sha256(p)}  {p.name}\n" for p in sorted(wheels, key=lambda p: p.name))


# ----------------------------------------------------------------------------------------------------
# command line


def cmd_release_check(args: argparse.Namespace) -> int:
    matrix = Matrix.load(args.matrix)
    existing: list[str] = []
    if args.existing_assets:
        existing = Path(args.existing_assets).read_text(encoding="utf-8").splitlines()
    root = Path(args.dir)
    profiles = [name for value in args.profile for name in value.split()]  # "a b" from a CI output
    sums = [Path(args.sha256sums).name] if args.sha256sums else []
    report = check_release(matrix, root, profiles, args.tag, args.tag_package, existing, sums)
    print(report.render(), flush=True)
    if not report.passed:
        return 1
    wheels = report.wheels
    if args.collect:
        out = Path(args.collect)
        if out.exists() and any(out.iterdir()):
            raise UsageError(f"--collect {out}: the folder is not empty")
        out.mkdir(parents=True, exist_ok=True)
        wheels = [Path(shutil.copy2(w, out / w.name)) for w in wheels]
        print(f"collected {len(wheels)} wheels in {out}")
    if args.sha256sums:
        path = Path(args.sha256sums)
        path.write_text(sums_text(wheels), encoding="utf-8", newline="\n")
        print(f"wrote {path} ({len(wheels)} entries)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    check = sub.add_parser(
        "release-check",
        help="check downloaded artifacts against the release profiles before publishing",
        description="Exactly one wheel per planned build of the profiles (all platforms), each named as "
        "planned, none twice, nothing else; optionally the tag against the version and the names "
        "against the assets a release already has. Then --collect and --sha256sums.",
    )
    check.add_argument("dir", help="folder of wheels, or of artifact folders wheels-<build id>/")
    check.add_argument(
        "--profile", action="append", required=True, help="release profile (repeatable, or space-separated)"
    )
    check.add_argument("--tag", help="the release tag, e.g. v2.2.0: must be v<version of --tag-package>")
    check.add_argument("--tag-package", default="sageattention", help="package whose version the tag names")
    check.add_argument("--existing-assets", help="file listing the release's current asset names, one a line")
    check.add_argument("--collect", help="copy the checked wheels into this (empty or new) folder")
    check.add_argument("--sha256sums", help=f"write a {SUMS_FILE} file (sha256sum format) here")
    check.set_defaults(func=cmd_release_check)
