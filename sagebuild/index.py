"""``sagebuild index`` (a PEP 503 simple index of a wheel folder) and ``sagebuild which``.

pip picks among wheels of one version by tag, then by build tag, and never backtracks over wheels
of the same version on a dependency conflict. Build-tagged sageattention wheels all share one
version, so a single flat index would always offer the highest build tag (the newest torch). Next to
the flat ``simple/`` index, ``index`` therefore writes one index per PyTorch build,
``torch2.8.0-cu129/simple/``, holding that build's wheels plus the pure-Python wheel, and one per
CUDA line for the abi3 wheels, ``cu12/simple/`` and ``cu13/simple/``. ``which`` names the wheel that
fits an environment: the abi3 wheel of its CUDA line where one fits (torch and Python at or above the
abi3 floors, a platform and a CUDA line the abi3 profiles build), else the per-torch one. (sageattn3
wheels differ in their local version, so pip's resolver can choose among them in the flat index as
well.)
"""

from __future__ import annotations

import html
import json
import os
import shutil
import sys
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from . import envs, tags
from .errors import MatrixError, SagebuildError, TagError
from .matrix import Matrix, Target

INDEX_MANIFEST = "sagebuild-index.json"


def variant_name(torch: str, cuda: str) -> str:
    """The folder of one PyTorch build's index: ``torch2.8.0-cu129``."""
    return f"torch{torch}-{tags.cuda_tag(cuda)}"


@dataclass
class IndexedWheel:
    path: Path
    filename: str
    project: str
    sha256: str
    variant: str | None  # None: every variant (pure wheels) or only the flat index (unknown names)
    pure: bool


def _href(target: Path, page_dir: Path) -> str:
    try:
        return Path(os.path.relpath(target, page_dir)).as_posix()
    except ValueError:  # another drive on Windows
        return envs.file_uri(target)


def _write_page(path: Path, title: str, links: list[tuple[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = "\n".join(f'    <a href="{html.escape(href)}">{html.escape(text)}</a><br>' for href, text in links)
    path.write_text(
        "<!DOCTYPE html>\n<html>\n  <head>\n"
        '    <meta name="pypi:repository-version" content="1.0">\n'
        f"    <title>{html.escape(title)}</title>\n  </head>\n  <body>\n"
        f"    <h1>{html.escape(title)}</h1>\n{body}\n  </body>\n</html>\n",
        encoding="utf-8",
    )


def _write_simple(root: Path, wheels: list[IndexedWheel]) -> None:
    """``root/index.html`` listing projects and ``root/<project>/index.html`` listing files."""
    if root.exists():
        shutil.rmtree(root)
    projects = sorted({w.project for w in wheels})
    _write_page(root / "index.html", "Simple index", [(f"{p}/", p) for p in projects])
    for project in projects:
        page = root / project / "index.html"
        links = [
            (f"{_href(w.path, page.parent)}#sha256={w.sha256}", w.filename)
            for w in sorted(wheels, key=lambda w: w.filename)
            if w.project == project
        ]
        _write_page(page, f"Links for {project}", links)


def not_a_wheel(path: Path) -> str | None:
    """Why the ``.whl`` file at ``path`` is not a wheel pip could install, or None when it is one: a
    valid wheel name, a zip archive that is not empty, and a ``.dist-info`` folder with WHEEL and
    METADATA (pip reads both)."""
    try:
        parse_wheel_filename(path.name)
    except ValueError as exc:
        return f"not a valid wheel name ({exc})"
    size = path.stat().st_size
    if size == 0:
        return "an empty file (0 bytes): an interrupted download or copy?"
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as exc:
        return f"not a zip archive ({size} bytes; {exc})"
    dist_infos = {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
    for folder in dist_infos:
        if f"{folder}/WHEEL" in names and f"{folder}/METADATA" in names:
            return None
    return "no .dist-info folder with WHEEL and METADATA in the archive"


def build_index(wheel_dir: Path, out_dir: Path, matrix: Matrix, copy: bool = False) -> dict:
    """Write the flat and per-build indexes for the wheels in ``wheel_dir``; returns the manifest.

    Every ``*.whl`` file must be a wheel (``not_a_wheel``): otherwise nothing is written and the error
    names each bad file, since an index that links a broken file fails only later, in someone's pip.
    Other files in the folder are not indexed; a note names them.
    """
    wheel_dir, out_dir = Path(wheel_dir).resolve(), Path(out_dir).resolve()
    found = sorted(p for p in wheel_dir.glob("*.whl") if p.is_file())
    if not found:
        raise SagebuildError(f"no .whl files in {wheel_dir}")
    broken = [(path, not_a_wheel(path)) for path in found]
    broken = [(path, why) for path, why in broken if why]
    if broken:
        raise SagebuildError(
            f"{len(broken)} of the {len(found)} .whl files in {wheel_dir} are not wheels; nothing was "
            "indexed (remove or rebuild them):\n" + "\n".join(f"  {path.name}: {why}" for path, why in broken)
        )
    others = sorted(
        p.name for p in wheel_dir.iterdir() if p.is_file() and p.suffix != ".whl" and p.name != INDEX_MANIFEST
    )
    if others:
        print(f"note: not indexed (not .whl files): {', '.join(others)}", file=sys.stderr)
    wheels: list[IndexedWheel] = []
    for path in found:
        project = canonicalize_name(parse_wheel_filename(path.name)[0])
        variant, pure = None, False
        try:
            name = matrix.parse_wheel_name(path.name)
            pure = name.kind == "pure"
            if name.kind == "abi3":  # one index path per CUDA line: cu12/, cu13/
                variant = f"cu{name.cuda}"
            elif not pure:
                variant = variant_name(name.torch, name.cuda)
        except (TagError, MatrixError) as exc:
            print(f"note: {path.name} goes into the flat index only ({exc})", file=sys.stderr)
        if copy:
            files = out_dir / "files"
            files.mkdir(parents=True, exist_ok=True)
            if path.parent != files:
                shutil.copy2(path, files / path.name)
            path = files / path.name
        wheels.append(IndexedWheel(path, path.name, project, envs.file_sha256(path), variant, pure))
    _write_simple(out_dir / "simple", wheels)
    variants = sorted({w.variant for w in wheels if w.variant})
    manifest = {"simple": sorted(w.filename for w in wheels), "variants": {}}
    for variant in variants:
        chosen = [w for w in wheels if w.variant == variant]
        projects = {w.project for w in chosen}
        chosen += [w for w in wheels if w.pure and w.project in projects]
        _write_simple(out_dir / variant / "simple", chosen)
        manifest["variants"][variant] = sorted(w.filename for w in chosen)
    (out_dir / INDEX_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


# ----------------------------------------------------------------------------------------------------
# which


@dataclass
class EnvInfo:
    python: str
    platform: str | None
    torch: str | None  # public version, e.g. 2.8.0
    torch_cuda: str | None


def current_env(matrix: Matrix) -> EnvInfo:
    """This environment: its Python, the matrix's platform of this machine, torch and torch's CUDA."""
    torch_version = torch_cuda = None
    try:
        import torch  # noqa: PLC0415

        torch_version = torch.__version__.split("+")[0]
        torch_cuda = torch.version.cuda
    except ImportError:
        pass
    return EnvInfo(
        f"{sys.version_info[0]}.{sys.version_info[1]}",
        envs.current_platform(matrix.wheel_platforms()),
        torch_version,
        torch_cuda,
    )


def _manifest(index_dir: Path, lines: list[str]) -> dict | None:
    """The manifest of an index made by `index`, or None with a line that says how to make it."""
    path = Path(index_dir) / INDEX_MANIFEST
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        lines.append(f"{path} not found: run `python -m sagebuild index {index_dir}` first")
        return None


def which(
    matrix: Matrix, env: EnvInfo, package: str = "sageattention", index_dir: Path | None = None
) -> tuple[int, list[str]]:
    """(exit code, lines): the wheel that fits ``env`` and how to install it."""
    pkg = matrix.package(package)
    version = matrix.package_version(package)
    cuda_text = f" (CUDA {env.torch_cuda})" if env.torch_cuda else (" (CPU build)" if env.torch else "")
    lines = [
        f"environment: Python {env.python}, platform {env.platform or 'unsupported'}, "
        f"torch {env.torch or 'not installed'}{cuda_text}"
    ]
    pure_wheel = f"{pkg.name}-{version}-py3-none-any.whl"
    if env.platform is None:
        lines.append(
            f"no {pkg.name} CUDA wheels are built for this platform; "
            f"the pure-Python wheel works: {pure_wheel}"
        )
        return 1, lines
    if env.torch is None:
        lines.append(
            f"install PyTorch first: a {pkg.name} CUDA wheel is built for one torch release and pins it"
        )
        return 1, lines
    if env.torch_cuda is None:
        if pkg.naming == "local-version":
            lines.append(f"{pkg.name} needs a CUDA build of torch")
            return 1, lines
        lines.append(f"torch is a CPU build: the pure-Python wheel fits: {pure_wheel}")
        lines.append(f"  pip install {pure_wheel}")
        return 0, lines
    abi3, why_not = abi3_fit(matrix, pkg.name, env)
    if abi3 is not None:
        return _which_abi3(matrix, abi3, env, lines, index_dir)
    if why_not:
        lines.append(why_not)
    try:
        target = matrix.make_target(pkg.name, env.platform, env.torch, env.torch_cuda, env.python)
    except MatrixError as exc:
        lines.append(f"no {pkg.name} build fits this environment: {exc}")
        if pkg.naming == "build-tag":
            lines.append(f"the pure-Python wheel works with any torch >= 2.4: {pure_wheel}")
        return 1, lines
    variant = variant_name(target.torch, target.cuda)
    lines.append(f"build id: {target.id}")
    lines.append(f"wheel:    {target.wheel_name}")
    if index_dir is not None:
        manifest = _manifest(index_dir, lines)
        if manifest is None:
            return 1, lines
        if target.wheel_name in manifest.get("variants", {}).get(variant, []):
            simple = (Path(index_dir) / variant / "simple").resolve()
            lines.append(f"  pip install --index-url {envs.file_uri(simple)} {pkg.name}")
            return 0, lines
        lines.append(f"not in {index_dir}; build it with:")
    else:
        lines.append("build it with:")
    lines.append(f"  python -m sagebuild build --target {target.id}")
    lines.append("then install it with:")
    lines.append(f"  pip install wheelhouse/{target.wheel_name}")
    return (1 if index_dir is not None else 0), lines


def _release(version: str) -> tuple[int, ...] | None:
    try:
        return Version(version).release
    except InvalidVersion:
        return None


def abi3_target(matrix: Matrix, package: str, platform: str, cuda: str) -> Target | None:
    """The abi3 wheel of ``cuda``'s line for ``platform`` as the profiles of sets with ``wheel: abi3``
    build it (``abi3-release``: linux-sageattention-abi3-cu128-python312), or None where none does."""
    line = tags.cuda_line(cuda)
    found: list[Target] = []
    for name, profile in matrix.profiles.items():
        spec = matrix.sets[profile.set]
        if spec.get("wheel") != "abi3" or spec.get("package") != package:
            continue
        if profile.platforms and platform not in profile.platforms:
            continue
        found += [
            t for t in matrix.profile_targets(name, platform, package) if tags.cuda_line(t.cuda) == line
        ]
    return next((t for t in found if t.default_archs), found[0] if found else None)


def abi3_fit(matrix: Matrix, package: str, env: EnvInfo) -> tuple[Target | None, str | None]:
    """(the abi3 wheel's target, None) where one fits ``env`` (a CUDA build of torch); else (None, the
    line that says why not, or None where the package has no abi3 wheels or ``env`` is not one an
    abi3 wheel could serve at all: no platform, no torch, a CPU build, a CUDA line without them)."""
    entry = matrix.package(package).abi3
    if entry is None or env.platform is None or env.torch is None or env.torch_cuda is None:
        return None, None
    try:
        target = abi3_target(matrix, package, env.platform, env.torch_cuda)
    except TagError:  # a CUDA version that is not one
        return None, None
    if target is None:
        return None, None
    torch, floor = _release(env.torch), _release(entry["torch_floor"])
    if torch is None:
        return None, None
    if torch < floor:
        return None, (
            f"the abi3 wheel ({target.wheel_name}) does not fit: it needs torch >= "
            f"{entry['torch_floor']} (its floor), this is torch {env.torch}"
        )
    python = _release(env.python)
    if python is not None and python < _release(entry["python_floor"]):
        return None, (
            f"the abi3 wheel ({target.wheel_name}) does not fit: it needs Python >= "
            f"{entry['python_floor']} (its floor), this is Python {env.python}"
        )
    return target, None


def _abi3_in_index(matrix: Matrix, files: list[str], target: Target) -> str | None:
    """The file of ``files`` that is ``target``'s abi3 wheel (as built, or repaired: any platform tag
    of its platform)."""
    if target.wheel_name in files:
        return target.wheel_name
    for filename in files:
        try:
            name = matrix.parse_wheel_name(filename)
        except (TagError, MatrixError):
            continue
        if (name.kind, name.project, name.platform, name.cuda, name.version) == (
            "abi3",
            canonicalize_name(target.package),
            target.platform,
            tags.cuda_line(target.cuda),
            target.full_version,
        ):
            return filename
    return None


def _which_abi3(
    matrix: Matrix, target: Target, env: EnvInfo, lines: list[str], index_dir: Path | None
) -> tuple[int, list[str]]:
    """``which``'s answer where the abi3 wheel ``target`` fits: the wheel, its CUDA line, how to
    install it (the package index's for the default line, an index's ``cuNN/simple`` path for
    another; with ``index_dir``, exit 0 only when the wheel is in it) and how to build it."""
    pkg = matrix.package(target.package)
    line = tags.cuda_line(target.cuda)
    default = line == pkg.abi3["default_line"]
    platform = matrix.platform(target.platform)
    repaired = ""
    if platform.repair_platform:
        name = replace(target, wheel_platform=platform.repair_platform).wheel_name
        repaired = f" ({name} once repaired)"
    lines.append(f"build id: {target.id}")
    lines.append(f"wheel:    {target.wheel_name}{repaired}")
    lines.append(
        f"CUDA line {line}{' (the default line)' if default else ''}: one abi3 wheel for torch CUDA "
        f"{line}.x, every torch >= {pkg.abi3['torch_floor']} and Python >= {pkg.abi3['python_floor']}"
    )
    variant = f"cu{line}"
    if index_dir is not None:
        manifest = _manifest(index_dir, lines)
        if manifest is None:
            return 1, lines
        variants = manifest.get("variants", {})
        found = _abi3_in_index(matrix, variants.get(variant, []), target)
        if found is not None:
            simple = (Path(index_dir) / variant / "simple").resolve()
            lines.append(f"in {index_dir}: {found}; install it with:")
            lines.append(f"  pip install --index-url {envs.file_uri(simple)} {pkg.name}")
            return 0, lines
        pinned = _pinned_in_index(matrix, pkg.name, env, Path(index_dir), variants)
        if pinned is not None:
            pinned_target, simple = pinned
            lines.append(
                f"not in {index_dir}; the per-torch wheel that fits is ({pinned_target.wheel_name}), "
                "install it with:"
            )
            lines.append(f"  pip install --index-url {envs.file_uri(simple)} {pkg.name}")
            return 0, lines
        lines.append(f"not in {index_dir}; build it with:")
    else:
        if default:
            lines.append("install it from the package index:")
            lines.append(f"  pip install {pkg.name}")
        else:
            lines.append(
                f"install it from the {variant}/ path of an index made by `python -m sagebuild index` "
                "(`which --index DIR` names it):"
            )
            lines.append(f"  pip install --index-url INDEX/{variant}/simple {pkg.name}")
        lines.append("or build it with:")
    lines.append(f"  python -m sagebuild build --target {target.id}")
    lines.append("then install it with:")
    lines.append(f"  pip install wheelhouse/{target.wheel_name}")
    return (1 if index_dir is not None else 0), lines


def _pinned_in_index(
    matrix: Matrix, package: str, env: EnvInfo, index_dir: Path, variants: dict
) -> tuple[Target, Path] | None:
    """The per-torch wheel that fits ``env`` and its index path, where the index of ``variants``
    (made in ``index_dir``) holds it: an index of per-torch wheels serves on without abi3 wheels."""
    try:
        target = matrix.make_target(package, env.platform, env.torch, env.torch_cuda, env.python)
    except MatrixError:
        return None
    variant = variant_name(target.torch, target.cuda)
    if target.wheel_name not in variants.get(variant, []):
        return None
    return target, (Path(index_dir) / variant / "simple").resolve()
