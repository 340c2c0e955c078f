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


def _left_out_row(name: str, package: str, platforms: str, note: dict, combos: list) -> list[str]:
    """A row of the left-out table: the set, what it leaves out (where), the facts and the why."""
    torches = ", ".join(dict.fromkeys(c[0] for c in combos))
    cudas = ", ".join(dict.fromkeys(c[1] for c in combos))
    pythons = ", ".join(dict.fromkeys(c[2] for c in combos))
    return [
        f"`{name}`",
        package,
        platforms,
        f"PyTorch {torches}; CUDA {cudas}; Python {pythons}",
        "; ".join(note["facts"]),
        note["why"],
    ]


def _combos(targets) -> list[tuple]:
    """What a platform's builds of a profile are, apart from the platform."""
    return [(t.torch, t.cuda, t.python, t.archs) for t in targets]


def _counts(matrix: Matrix, profile: str, platforms) -> str:
    """A profile's builds per platform: ``10``, or ``10, 10, 5`` in the order of ``platforms``."""
    counts = [len(matrix.profile_targets(profile, platform=p)) for p in platforms]
    return str(counts[0]) if len(set(counts)) == 1 else ", ".join(str(n) for n in counts)


def _target_table(targets) -> list[str]:
    return _table(
        ["build id", "PyTorch", "CUDA", "Python", "archs", "wheel"],
        [[f"`{t.id}`", t.torch, t.cuda, t.python, t.arch_list, f"`{t.wheel_name}`"] for t in targets],
    )


def _abi3_cell(abi3: dict) -> str:
    """A package's abi3 wheels: their tag, torch floor and CUDA lines."""
    tag = tags.abi3_python_tag(abi3["python_floor"])
    return (
        f"`{tag}-abi3`, torch >= {abi3['torch_floor']}, one per CUDA line "
        f"(CUDA {abi3['default_line']}: no local version, others `+cuNN`)"
    )


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
                _abi3_cell(pkg.abi3) if pkg.abi3 else "-",
                ", ".join(pkg.default_archs),
                ", ".join(pkg.optional_archs) or "-",
                f"`{example.wheel_name}`" if example else "-",
            ]
        )
    lines += _table(
        ["package", "per-torch naming", "abi3 wheels", "default archs", "optional archs", "example"], rows
    )
    lines += [
        "A package with abi3 wheels has the c-abi binding: its compiled modules import nothing of libtorch",
        "and only the limited API of CPython, so one wheel per CUDA line and platform serves every torch",
        "from the floor in its METADATA on, instead of one wheel per torch, CUDA and Python. The per-torch",
        "wheels remain for the profiles that build them.",
        "",
    ]

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
        "CUDA builds that sageattention can use and the CPython versions each release ships wheels for",
        "(a platform in parentheses has only those CUDA builds).",
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
                ", ".join(r.cuda)
                + "".join(f" ({p}: {', '.join(c) or 'none'})" for p, c in r.platform_cuda.items()),
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
            left_rows.append(_left_out_row(name, spec["package"], "every", note, note["combos"]))
    for platform in platforms:
        for note in matrix.platform_left_out(platform):
            for name in note["sets"]:
                hits = [(combo, fact) for n, combo, fact in note["hits"] if n == name]
                row = {**note, "facts": list(dict.fromkeys(fact for _, fact in hits))}
                package = matrix.sets[name]["package"]
                left_rows.append(_left_out_row(name, package, platform, row, [c for c, _ in hits]))
    if left_rows:
        lines += [
            "## Left out of the build sets",
            "",
            "Combinations a build set lists that are not built, because the PyTorch release does not ship",
            "them (`only_shipped`) or does not ship them for a platform (`platform_cuda`), and why that is",
            "acceptable (`left_out` of the set, or of the platform, in build-matrix.yaml).",
            "",
        ]
        lines += _table(["set", "package", "platforms", "left out", "matrix facts", "why"], left_rows)

    lines += [
        "## Profiles",
        "",
        "Builds per platform; a platform where PyTorch publishes fewer of the set's builds has fewer",
        "(see Left out of the build sets).",
        "",
    ]
    lines += _table(
        ["profile", "package", "builds", "platforms", "description"],
        [
            [
                f"`{p.name}`",
                matrix.sets[p.set]["package"],
                _counts(matrix, p.name, p.platforms or platforms),
                ", ".join(p.platforms or platforms),
                p.description,
            ]
            for p in matrix.profiles.values()
        ],
    )
    for p in matrix.profiles.values():
        first, *others = p.platforms or platforms
        targets = matrix.profile_targets(p.name, platform=first)
        lines += [f"### {p.name}", "", p.description + ".", ""]
        same = [o for o in others if _combos(matrix.profile_targets(p.name, platform=o)) == _combos(targets)]
        if others:
            lines += [f"Listed for {first}" + ("." if not same else "; ")]
            if same:
                verb = "builds the same with its" if len(same) == 1 else "build the same, each with its"
                lines[-1] += f"{', '.join(same)} {verb} own id prefix and wheel tag."
            lines += [""]
        lines += _target_table(targets)
        for other in [o for o in others if o not in same]:
            lines += [f"On {other}:", ""]
            lines += _target_table(matrix.profile_targets(p.name, platform=other))
    return "\n".join(lines).rstrip() + "\n"
