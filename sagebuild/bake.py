"""``sagebuild bake``: docker-bake.hcl, rendered from build-matrix.yaml.

Every Linux build of every profile becomes a Bake target named by its build id (the ids `plan` prints),
with a ``test-`` counterpart; groups collect them (``default``, ``linux``, ``all``, one per PyTorch
minor release, one per profile, ``test-all``). The Dockerfile (dockerfile.builder.linux) runs
``sagebuild build --target ID`` inside a manylinux_2_28 image, so a Bake build is the same build as a
native one. The output is deterministic: same matrix, same bytes; a unit test compares the checked-in
file with a fresh rendering.
"""

from __future__ import annotations

import argparse
import configparser
import importlib.resources
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from . import tags
from .ci import toolkit_release
from .docs import write_generated
from .errors import SagebuildError, UsageError
from .matrix import Matrix, Platform, Target

OUTPUT = "docker-bake.hcl"
DOCKERFILE = "dockerfile.builder.linux"
SYSTEM = "Linux"  # Docker builds the matrix's platforms of this system (each in its manylinux image)
TOOLCHAIN_IMAGE = "sagebuild-toolchain"  # local tag of the toolchain stage (cibuildwheel can use it)
CUDA_IMAGE_REPO = "nvidia/cuda"  # the official CUDA images: the toolkit is copied out of the devel one
IMAGE_VARIABLE = "MANYLINUX_IMAGE"


def bake_platforms(matrix: Matrix) -> list[Platform]:
    """The matrix's Linux platforms, in its order."""
    return [p for p in matrix.platforms.values() if p.system == SYSTEM]


def _qualifier(matrix: Matrix, platform: str) -> str:
    """'' for the matrix's first Linux platform (its names stay those of the seeds: MANYLINUX_IMAGE,
    toolchain-cu128), else the platform's name."""
    first = bake_platforms(matrix)[0].name
    return "" if platform == first else platform


def image_variable(matrix: Matrix, platform: str) -> str:
    """The Bake variable holding a platform's manylinux image: MANYLINUX_IMAGE, MANYLINUX_IMAGE_LINUXARM."""
    qualifier = _qualifier(matrix, platform)
    return IMAGE_VARIABLE + ("_" + qualifier.upper().replace("-", "_") if qualifier else "")


def toolchain_name(matrix: Matrix, platform: str, cuda: str) -> str:
    """``toolchain-cu128`` (first Linux platform), ``toolchain-linuxarm-cu128`` (another one)."""
    qualifier = _qualifier(matrix, platform)
    return "toolchain-" + (f"{qualifier}-" if qualifier else "") + tags.cuda_tag(cuda)


def toolchain_image(matrix: Matrix, platform: str, cuda: str) -> str:
    """The local tag of a toolchain image: ``sagebuild-toolchain:cu128``."""
    qualifier = _qualifier(matrix, platform)
    return f"{TOOLCHAIN_IMAGE}:" + (f"{qualifier}-" if qualifier else "") + tags.cuda_tag(cuda)


@dataclass(frozen=True)
class BakeTarget:
    target: Target
    profiles: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.target.id

    @property
    def cuda_key(self) -> str:
        return tags.cuda_tag(self.target.cuda)

    @property
    def python_abi(self) -> str:
        """The folder of this Python in a manylinux image: /opt/python/cp312-cp312."""
        tag = self.target.python_tag
        return f"{tag}-{tag}"

    @property
    def torch_group(self) -> str:
        major, minor, _ = tags.release_parts(self.target.torch, 3)
        return f"pytorch{major}{minor}"


def _linux_targets(matrix: Matrix, profile: str) -> list[Target]:
    return [t for p in bake_platforms(matrix) for t in matrix.profile_targets(profile, platform=p.name)]


def bake_targets(matrix: Matrix) -> list[BakeTarget]:
    """Every Linux build of every profile, once: platform by platform, in the order the profiles list
    them."""
    order: dict[str, Target] = {}
    owners: dict[str, list[str]] = {}
    for platform in bake_platforms(matrix):
        for profile in matrix.profiles:
            for target in matrix.profile_targets(profile, platform=platform.name):
                order.setdefault(target.id, target)
                owners.setdefault(target.id, []).append(profile)
    return [BakeTarget(t, tuple(owners[i])) for i, t in order.items()]


def _torch_key(name: str, targets: list[BakeTarget]) -> tuple[int, ...]:
    target = next(t.target for t in targets if t.name == name)
    return tags.release_parts(target.torch, 3)


def _q(value: str) -> str:
    """An HCL string literal (JSON escaping is valid HCL for the characters we emit)."""
    return json.dumps(value)


def _list(items, indent: str = "    ") -> str:
    items = list(items)
    if not items:
        return "[]"
    body = ",\n".join(f"{indent}{_q(i)}" for i in items)
    return "[\n" + body + ",\n" + indent[:-2] + "]"


def _block(kind: str, name: str, attrs: list[tuple[str, str]], comment: str | None = None) -> list[str]:
    lines = [f"# {comment}"] if comment else []
    lines.append(f"{kind} {_q(name)} {{")
    width = max((len(k) for k, _ in attrs), default=0)
    for key, value in attrs:
        lines.append(f"  {key:<{width}} = {value}")
    lines += ["}", ""]
    return lines


def _args(pairs: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in pairs)
    body = "\n".join(f"    {k:<{width}} = {v}" for k, v in pairs)
    return "{\n" + body + "\n  }"


def render(matrix: Matrix) -> str:
    platforms = bake_platforms(matrix)
    targets = bake_targets(matrix)
    if not targets:
        raise SagebuildError(f"no profile has {SYSTEM} builds: nothing to bake")
    for platform in platforms:
        if not platform.manylinux_image or not platform.docker_platform:
            raise SagebuildError(
                f"platform {platform.name}: build-matrix.yaml gives no manylinux_image/docker_platform, "
                "so Docker cannot build its wheels"
            )
    lines = [
        f"# {OUTPUT}: Docker Bake targets for every Linux build of build-matrix.yaml.",
        "# Generated by `python -m sagebuild bake`: do not edit by hand (a unit test fails when stale).",
        "#",
        "#   docker buildx bake linux-sageattention-pytorch28-cu129-python312       # a wheel in wheelhouse/",
        "#   docker buildx bake test-linux-sageattention-pytorch28-cu129-python312  # install + import it",
        "#   docker buildx bake default | linux | all | pytorch28 | profile-stable | test-all",
        "#",
        "# Every file in a wheel is stamped with SOURCE_DATE_EPOCH, which must be the last commit's time,",
        "# as in a native build (the build context holds no .git to read it from); sagebuild prints it:",
        "#   export SOURCE_DATE_EPOCH=$(python -m sagebuild bake --source-date-epoch)",
        "# The manylinux images are those of build-matrix.yaml (platforms: manylinux_image), by digest.",
        "# Targets are named by the build ids of `python -m sagebuild plan`; see docs/ci.md.",
        "",
    ]
    for platform in platforms:
        lines += _block(
            "variable",
            image_variable(matrix, platform.name),
            [("default", _q(platform.manylinux_image))],
            f"The {platform.repair_platform} image the {platform.name} wheels are built in "
            f"(platforms.{platform.name}.manylinux_image).",
        )
    lines += _block(
        "variable",
        "SOURCE_DATE_EPOCH",
        [("default", _q(""))],
        "Required: the last commit's time (see above); the build stops without it.",
    )
    lines += _block(
        "variable",
        "SAGEBUILD_TORCH_INDEX",
        [("default", _q(""))],
        "Index for torch, a template with {cuda_tag} (empty: pip's configured index).",
    )
    lines += _block("variable", "WHEELHOUSE", [("default", _q("wheelhouse"))], "Where wheels are written.")
    lines += _block(
        "variable",
        "CUDA_IMAGE_DISTRO",
        [("default", _q("rockylinux8"))],
        f"{CUDA_IMAGE_REPO} image flavour the toolkit is copied from (glibc 2.28, like manylinux_2_28).",
    )

    # groups ------------------------------------------------------------------------------------------
    names = [t.name for t in targets]
    default = [t.name for t in targets if "default" in t.profiles] or names[:1]
    lines += _block("group", "default", [("targets", _list(default))], "The pull-request build.")
    for platform in platforms:
        members = [t.name for t in targets if t.target.platform == platform.name]
        lines += _block(
            "group", platform.name, [("targets", _list(members))], f"Every {platform.name} wheel."
        )
    lines += _block(
        "group", "all", [("targets", _list(p.name for p in platforms))], "Every wheel Docker can build."
    )
    lines += _block("group", "test-all", [("targets", _list("test-" + n for n in names))])
    for package in matrix.packages:
        members = [t.name for t in targets if t.target.package == package]
        if members:
            lines += _block("group", package, [("targets", _list(members))])
    torch_groups: dict[str, list[str]] = {}
    for t in targets:
        torch_groups.setdefault(t.torch_group, []).append(t.name)
    for group, members in sorted(torch_groups.items(), key=lambda kv: _torch_key(kv[1][0], targets)):
        lines += _block("group", group, [("targets", _list(members))])
    for profile in matrix.profiles:
        members = list(dict.fromkeys(t.id for t in _linux_targets(matrix, profile)))
        if members:
            lines += _block("group", f"profile-{profile}", [("targets", _list(members))])

    # shared settings, one per platform and one per CUDA -----------------------------------------------
    lines += _block(
        "target",
        "_builder",
        [
            ("context", _q(".")),
            ("dockerfile", _q(DOCKERFILE)),
            (
                "args",
                _args(
                    [
                        ("SAGEBUILD_TORCH_INDEX", "SAGEBUILD_TORCH_INDEX"),
                        ("SOURCE_DATE_EPOCH", "SOURCE_DATE_EPOCH"),
                    ]
                ),
            ),
        ],
        "Settings every target shares.",
    )
    for platform in platforms:
        lines += _block(
            "target",
            f"_{platform.name}",
            [
                ("inherits", '["_builder"]'),
                ("platforms", f"[{_q(platform.docker_platform)}]"),
                ("args", _args([("MANYLINUX_IMAGE", image_variable(matrix, platform.name))])),
            ],
            f"The {platform.name} wheels: {platform.docker_platform}, in its manylinux image.",
        )
    cudas = sorted({t.target.cuda for t in targets}, key=lambda v: tuple(int(p) for p in v.split(".")))
    for cuda in cudas:
        key = tags.cuda_tag(cuda)
        release = toolkit_release(matrix, cuda)
        lines += _block(
            "target",
            f"_{key}",
            [
                (
                    "args",
                    _args(
                        [
                            ("CUDA_VERSION", _q(cuda)),
                            ("CUDA_IMAGE", _q(f"{CUDA_IMAGE_REPO}:{release}-devel-${{CUDA_IMAGE_DISTRO}}")),
                        ]
                    ),
                ),
            ],
            f"CUDA {cuda} (toolkit {release}).",
        )
    pairs = list(dict.fromkeys((t.target.platform, t.target.cuda) for t in targets))
    pairs.sort(key=lambda pc: ([p.name for p in platforms].index(pc[0]), cudas.index(pc[1])))
    for platform, cuda in pairs:
        lines += _block(
            "target",
            toolchain_name(matrix, platform, cuda),
            [
                ("inherits", f"[{_q('_' + platform)}, {_q('_' + tags.cuda_tag(cuda))}]"),
                ("target", _q("toolchain")),
                ("tags", f"[{_q(toolchain_image(matrix, platform, cuda))}]"),
                ("output", '["type=docker"]'),
            ],
            f"The {platform} build image alone (manylinux + CUDA {cuda}), e.g. for cibuildwheel.",
        )

    # one wheel target and one test target per build -------------------------------------------------------
    for t in targets:
        target = t.target
        lines += _block(
            "target",
            t.name,
            [
                ("inherits", f"[{_q('_' + target.platform)}, {_q('_' + t.cuda_key)}]"),
                ("target", _q("wheel")),
                (
                    "args",
                    _args(
                        [
                            ("BUILD_ID", _q(t.name)),
                            ("PYTHON_ABI", _q(t.python_abi)),
                        ]
                    ),
                ),
                ("output", f"[{_q('type=local,dest=${WHEELHOUSE}')}]"),
            ],
            f"{target.wheel_name}: torch {target.torch}, CUDA {target.cuda}, Python {target.python}, "
            f"archs {target.arch_list}",
        )
        lines += _block(
            "target",
            f"test-{t.name}",
            [
                ("inherits", f"[{_q(t.name)}]"),
                ("target", _q("test")),
                ("output", '["type=cacheonly"]'),
            ],
        )
    return "\n".join(lines).rstrip() + "\n"


def pinned_base_image(platform: Platform) -> str:
    """The image of a Linux platform's repair policy (manylinux_2_28 for manylinux_2_28_aarch64) and
    CPU that the installed (pinned) cibuildwheel uses, by digest."""
    arch = platform.machine
    policy = (platform.repair_platform or "").removesuffix(f"_{arch}")
    try:
        resource = importlib.resources.files("cibuildwheel") / "resources" / "pinned_docker_images.cfg"
        text = resource.read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError, OSError) as exc:
        raise SagebuildError(
            "cibuildwheel is not installed here (pip install -r requirements-dev.txt); it pins the "
            f"manylinux images ({exc})"
        ) from exc
    config = configparser.ConfigParser(inline_comment_prefixes=("#",))
    config.read_string(text)
    try:
        return config[arch][policy].strip()
    except KeyError as exc:
        raise SagebuildError(f"cibuildwheel's pinned images have no {arch} {policy} ({exc})") from exc


# ----------------------------------------------------------------------------------------------------
# command line


def cmd_bake(args: argparse.Namespace) -> int:
    if args.base_image:
        matrix = Matrix.load(args.matrix)
        names = [p.name for p in bake_platforms(matrix)]
        name = args.platform or names[0]
        if name not in names:
            raise UsageError(f"--platform {name}: not a Linux platform of the matrix ({', '.join(names)})")
        print(pinned_base_image(matrix.platform(name)))
        return 0
    if args.source_date_epoch:
        from .build import source_date_epoch  # noqa: PLC0415

        matrix = Matrix.load(args.matrix)
        epoch, origin = source_date_epoch(matrix.root)
        print(epoch)
        print(f"SOURCE_DATE_EPOCH: {origin}", file=sys.stderr)
        return 0
    matrix = Matrix.load(args.matrix)
    text = render(matrix)
    path = Path(args.output) if args.output else matrix.root / OUTPUT
    summary = f" ({len(bake_targets(matrix))} build targets)"
    return write_generated(path, text, args.check, "python -m sagebuild bake", summary)


def register(sub: argparse._SubParsersAction) -> None:
    bake = sub.add_parser(
        "bake",
        help="render docker-bake.hcl from the matrix",
        description="Write docker-bake.hcl: one wheel target and one test- target per Linux build of "
        "every profile, groups per profile, PyTorch release and package; --check only compares.",
    )
    bake.add_argument("--check", action="store_true", help="exit 1 when the file is out of date")
    bake.add_argument("--output", help=f"file to write (default: {OUTPUT} next to the matrix)")
    bake.add_argument(
        "--base-image",
        action="store_true",
        help="print the manylinux image pinned by the installed cibuildwheel for a Linux platform (what "
        "its manylinux_image must be; --platform, default: the first Linux platform)",
    )
    bake.add_argument("--platform", help="with --base-image: the Linux platform of the matrix")
    bake.add_argument(
        "--source-date-epoch",
        action="store_true",
        help="print the SOURCE_DATE_EPOCH a native build uses (the last commit's time), for "
        "`SOURCE_DATE_EPOCH=$(...) docker buildx bake`",
    )
    bake.set_defaults(func=cmd_bake)
