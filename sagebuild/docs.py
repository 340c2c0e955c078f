"""``sagebuild docs``: BUILD_MATRIX.md, rendered from build-matrix.yaml."""

from __future__ import annotations

import sys
from pathlib import Path

from . import tags
from .matrix import Matrix


def write_generated(path: Path, text: str, check: bool, command: str, summary: str = "") -> int:
    """Write a file generated from the matrix, or with ``check`` only compare it; the exit status."""
    if check:
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            print(f"{path} is out of date: run `{command}` and commit it", file=sys.stderr)
            return 1
        print(f"{path} is up to date")
        return 0
    path.write_text(text, encoding="utf-8", newline="\n")
    print(f"wrote {path}{summary}")
    return 0


OUTPUT = "BUILD_MATRIX.md"


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header, rows) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows), ""]


def render(matrix: Matrix) -> str:
    lines = [
        "# Build matrix",
        "",
        "<!-- Generated from build-matrix.yaml by `python -m sagebuild docs`. Do not edit by hand. -->",
        "",
        "What can be built, and what each build profile builds. Build one with",
        "`python -m sagebuild build --target ID`; list a profile with",
        "`python -m sagebuild plan --profile NAME`.",
        "See docs/building.md for how builds, names and checks work.",
        "",
        "## Packages",
        "",
    ]
    rows = []
    for pkg in matrix.packages.values():
        example = next(
            (t for p in matrix.profiles for t in matrix.profile_targets(p, package=pkg.name)), None
        )
        rows.append(
            [
                f"`{pkg.name}` {matrix.package_version(pkg.name)}",
                "`{torch}.{cuda}` build tag"
                if pkg.naming == "build-tag"
                else "`+cu{cuda}torch{version}` local version",
                ", ".join(pkg.default_archs),
                ", ".join(pkg.optional_archs) or "-",
                f"`{example.wheel_name}`" if example else "-",
            ]
        )
    lines += _table(["package", "naming", "default archs", "optional archs", "example"], rows)

    lines += ["## Platforms", ""]
    lines += _table(
        ["platform", "wheel tag", "after repair", "CI runner", "Docker Bake"],
        [
            [
                p.name,
                f"`{p.wheel_platform}`",
                f"`{p.repair_platform}`" if p.repair_platform else "-",
                p.runner,
                f"{p.docker_platform} in `{p.manylinux_image}`" if p.manylinux_image else "-",
            ]
            for p in matrix.platforms.values()
        ],
    )

    lines += [
        "## PyTorch releases",
        "",
        "CUDA builds that sageattention can use and the CPython versions each release ships wheels for.",
        "The plain package index serves one CUDA build per release (the plain index columns); the others",
        "come from a CUDA-specific index (`--index-url` or `SAGEBUILD_TORCH_INDEX`).",
        "",
    ]
    platforms = list(matrix.platforms)
    lines += _table(
        [
            "PyTorch",
            "build tag",
            "CUDA builds",
            "Python",
            *[f"plain index ({p})" for p in platforms],
            "source",
        ],
        [
            [
                r.version,
                f"`{tags.torch_tag(r.version)}`",
                ", ".join(r.cuda),
                ", ".join(r.python),
                *[
                    (f"CUDA {r.registry_cuda[p]}" if r.registry_cuda.get(p) else "CPU only")
                    for p in platforms
                ],
                r.source,
            ]
            for r in matrix.torch.values()
        ],
    )

    lines += [
        "## CUDA toolkits",
        "",
        "Archs are TORCH_CUDA_ARCH_LIST names; `a` marks arch-specific code (it runs only on that exact GPU",
        "generation). 12.0 needs CUDA >= 12.8; CUDA 13 targets nothing below 7.5.",
        "",
    ]
    rows = []
    for c in matrix.cuda.values():
        per_package = [
            ", ".join(a for a in pkg.all_archs if a in c.archs) or "-" for pkg in matrix.packages.values()
        ]
        if c.pip.unusable:
            toolkit = "no: " + " ".join(c.pip.unusable.split())
        else:
            toolkit = "yes: " + ", ".join(f"`{p}`" for p in c.pip.compiler_packages)
        rows.append(
            [
                c.version,
                f"`{c.tag}`",
                *per_package,
                ", ".join(c.archs),
                toolkit,
                ", ".join(f"`{p}`" for p in c.pip.cuobjdump) or "-",
            ]
        )
    lines += _table(
        [
            "CUDA",
            "tag",
            *[f"{p} archs" for p in matrix.packages],
            "every SASS target",
            "toolkit from pip packages",
            "cuobjdump",
        ],
        rows,
    )

    for pkg in matrix.packages.values():
        if not pkg.extensions:
            continue
        lines += [
            f"## Extension modules of {pkg.name}",
            "",
            "Each module gets SASS only for the requested archs",
            "that pass its filter; a module without kernel sources is skipped.",
            "",
        ]
        lines += _table(
            ["module", "kernel sources", "also compiled in", "archs"],
            [
                [
                    f"`{e.name}`",
                    ", ".join(f"`{k}`" for k in e.kernels),
                    ", ".join(f"`{s}`" for s in e.shared) or "-",
                    e.describe_filter(),
                ]
                for e in pkg.extensions
            ],
        )

    left_rows = []
    for name, spec in matrix.sets.items():
        for note in matrix.left_out(name):
            combos = note["combos"]
            torches = ", ".join(dict.fromkeys(c[0] for c in combos))
            cudas = ", ".join(dict.fromkeys(c[1] for c in combos))
            pythons = ", ".join(dict.fromkeys(c[2] for c in combos))
            left_rows.append(
                [
                    f"`{name}`",
                    spec["package"],
                    f"PyTorch {torches}; CUDA {cudas}; Python {pythons}",
                    "; ".join(note["facts"]),
                    note["why"],
                ]
            )
    if left_rows:
        lines += [
            "## Left out of the build sets",
            "",
            "Combinations a build set lists that are not built, because the PyTorch release does not ship",
            "them (`only_shipped`), and why that is acceptable (`left_out` in build-matrix.yaml).",
            "",
        ]
        lines += _table(["set", "package", "left out", "matrix facts", "why"], left_rows)

    lines += [
        "## Profiles",
        "",
        "Builds per platform; every profile builds the same list on each platform it names.",
        "",
    ]
    lines += _table(
        ["profile", "package", "builds", "platforms", "description"],
        [
            [
                f"`{p.name}`",
                matrix.sets[p.set]["package"],
                len(matrix.profile_targets(p.name, platform=(p.platforms or platforms)[0])),
                ", ".join(p.platforms or platforms),
                p.description,
            ]
            for p in matrix.profiles.values()
        ],
    )
    for p in matrix.profiles.values():
        first = (p.platforms or platforms)[0]
        targets = matrix.profile_targets(p.name, platform=first)
        others = [x for x in (p.platforms or platforms) if x != first]
        lines += [f"### {p.name}", "", p.description + ".", ""]
        if others:
            lines += [
                f"Listed for {first}; {', '.join(others)} builds the same with its own id prefix and "
                "wheel tag.",
                "",
            ]
        lines += _table(
            ["build id", "PyTorch", "CUDA", "Python", "archs", "wheel"],
            [[f"`{t.id}`", t.torch, t.cuda, t.python, t.arch_list, f"`{t.wheel_name}`"] for t in targets],
        )
    return "\n".join(lines).rstrip() + "\n"
