"""``sagebuild verify``: check a wheel's name, metadata, RECORD, compiled archs, and that it installs.

Every check prints one line with a mark; the result fails when any check fails.
"""

from __future__ import annotations

import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from wheel.wheelfile import WheelError, WheelFile

from . import envs, tags
from .errors import MatrixError, SagebuildError, TagError
from .matrix import Arch, Matrix, sort_archs

BUILD_INFO = "_build_info.json"
EXTENSION_RE = re.compile(r"\.(so|pyd)$")


def marks() -> tuple[str, str, str]:
    """(pass, fail, skip) marks that the console can print."""
    encoding = getattr(sys.stdout, "encoding", None) or "ascii"
    try:
        "✓✗–".encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return "OK", "XX", "--"
    return "✓", "✗", "–"


@dataclass
class Check:
    status: str  # "pass" | "fail" | "skip"
    label: str


@dataclass
class Report:
    wheel: str
    checks: list[Check] = field(default_factory=list)

    def ok(self, label: str) -> None:
        self.checks.append(Check("pass", label))

    def fail(self, label: str) -> None:
        self.checks.append(Check("fail", label))

    def skip(self, label: str) -> None:
        self.checks.append(Check("skip", label))

    def expect(self, condition: bool, good: str, bad: str) -> bool:
        (self.ok if condition else self.fail)(good if condition else bad)
        return condition

    @property
    def passed(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    def render(self) -> str:
        good, bad, skip = marks()
        sign = {"pass": good, "fail": bad, "skip": skip}
        lines = [f"Checking wheel: {self.wheel}"]
        lines += [f"  {sign[c.status]} {c.label}" for c in self.checks]
        failed = sum(c.status == "fail" for c in self.checks)
        lines.append(f"  => {'OK' if not failed else f'FAILED ({failed} of {len(self.checks)} checks)'}")
        return "\n".join(lines)


@dataclass
class VerifyOptions:
    expect_archs: list[str] | None = None
    smoke: bool = True
    smoke_skip_reason: str = "--no-smoke"
    smoke_python: str | None = None
    find_links: list[str] = field(default_factory=list)
    index_url: str | None = None
    torch_site: str | None = None  # reuse the torch of this site-packages in the smoke venv
    cuobjdump: str | None = None
    allow_missing_cuobjdump: bool = False
    fetch_cuobjdump: bool = False
    cache_dir: Path | None = None
    extra_cuda_homes: list[Path] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------------
# cuobjdump


def cuobjdump_candidates(options: VerifyOptions) -> list[Path]:
    name = envs.exe_name("cuobjdump")
    out = []
    if options.cuobjdump:
        out.append(Path(options.cuobjdump))
    if os.environ.get("SAGEBUILD_CUOBJDUMP"):
        out.append(Path(os.environ["SAGEBUILD_CUOBJDUMP"]))
    for home in options.extra_cuda_homes:
        out.append(Path(home) / "bin" / name)
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            out.append(Path(os.environ[var]) / "bin" / name)
    found = shutil.which("cuobjdump")
    if found:
        out.append(Path(found))
    nvcc = shutil.which("nvcc")
    if nvcc:
        out.append(Path(nvcc).resolve().parent / name)
    if options.cache_dir:
        out += sorted((options.cache_dir / "tools" / "cuobjdump").glob(f"nvidia/*/bin/{name}"))
    sites = [options.torch_site] if options.torch_site else []
    sites += [p for p in sys.path if p.endswith("site-packages")]
    for site in sites:
        out.append(Path(site) / "triton" / "backends" / "nvidia" / "bin" / name)
        out += sorted(Path(site).glob(f"nvidia/*/bin/{name}"))
    return out


def cuobjdump_version(cuobjdump: Path) -> tuple[int, int] | None:
    """The CUDA release a cuobjdump belongs to ("Build cuda_13.1.r13.1/..."), or None if it won't say."""
    try:
        proc = subprocess.run([str(cuobjdump), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"(?:release |cuda_)(\d+)\.(\d+)", proc.stdout)
    return (int(found.group(1)), int(found.group(2))) if found else None


def find_cuobjdump(options: VerifyOptions, min_cuda: tuple[int, int] | None = None) -> Path | None:
    """The first usable cuobjdump. With ``min_cuda``, older ones are passed over: they cannot name the
    targets of a newer toolkit (seen: the CUDA 12.8 cuobjdump inside triton 3.6 lists a sm_90a cubin
    as sm_90, so a correct wheel would fail its SASS check)."""
    for candidate in cuobjdump_candidates(options):
        if not (candidate.is_file() and os.access(candidate, os.X_OK)):
            continue
        if min_cuda is not None:
            version = cuobjdump_version(candidate)
            if version is not None and version < min_cuda:
                continue
        return candidate
    return None


def fetch_cuobjdump(cache_dir: Path, requirement: str) -> Path:
    """Install the pip package with cuobjdump into ``cache_dir/tools/cuobjdump``."""
    target = cache_dir / "tools" / "cuobjdump"
    envs.pip(sys.executable, ["install", "--no-deps", "--upgrade", "--target", str(target), requirement])
    found = sorted(target.glob(f"nvidia/*/bin/{envs.exe_name('cuobjdump')}"))
    if not found:
        raise SagebuildError(f"{requirement} installed no cuobjdump under {target}")
    return found[0]


def sass_archs(cuobjdump: Path, binary: Path) -> tuple[list[str], list[str]]:
    """(SASS archs, PTX archs) embedded in a binary, as TORCH_CUDA_ARCH_LIST names."""
    result = []
    for flag in ("--list-elf", "--list-ptx"):
        proc = subprocess.run([str(cuobjdump), flag, str(binary)], capture_output=True, text=True)
        text = proc.stdout + proc.stderr
        if proc.returncode != 0 and "does not contain device code" not in text and "No PTX" not in text:
            raise SagebuildError(f"{cuobjdump} {flag} {binary.name} failed: {text.strip()}")
        found = re.findall(r"\b(?:sm|compute)_(\d{2,3}[af]?)\b", proc.stdout)
        result.append(sort_archs(f"sm_{f}" for f in found))
    return result[0], result[1]


# ----------------------------------------------------------------------------------------------------
# Smoke test


def smoke_test(
    wheel: Path, python: str | Path, options: VerifyOptions, modules: Sequence[str], work: Path
) -> tuple[bool, str]:
    """Install the wheel into a fresh venv and import it (and its extension modules)."""
    venv = work / "smoke-venv"
    no_index = False
    if options.torch_site:
        # Borrow torch (and pip, setuptools...) from an existing environment through a .pth file: the
        # venv has no packages of its own, so the borrowed ones satisfy the wheel's requirements and
        # pip installs only the wheel itself, into the venv.
        exe = envs.create_venv(python, venv, with_pip=False)
        site = envs.site_packages(exe)
        (site / "_sagebuild_torch.pth").write_text(str(options.torch_site) + "\n", encoding="utf-8")
        no_index = not options.index_url and not options.find_links
    else:
        exe = envs.create_venv(python, venv)
    args = ["install", "--find-links", str(wheel.parent)]
    for link in options.find_links:
        args += ["--find-links", link]
    args += envs.index_args(options.index_url)
    if no_index:
        args.append("--no-index")
    args.append(str(wheel))
    try:
        envs.pip(exe, args)
    except SagebuildError as exc:
        return False, f"pip install failed: {exc}"
    top = (
        modules[0].split(".")[0] if modules else canonicalize_name(wheel.name.split("-")[0]).replace("-", "_")
    )
    code = (
        "import importlib, json, sys\n"
        "mods = json.loads(sys.argv[1])\n"
        "if mods:\n    import torch\n"
        f"import {top}\n"
        "for m in mods: importlib.import_module(m)\n"
        f"print({top}.__file__)\n"
    )
    proc = subprocess.run(
        [str(exe), "-c", code, json.dumps(list(modules))],
        cwd=str(work),
        capture_output=True,
        text=True,
        env=envs.clean_env(),
    )
    if proc.returncode != 0:
        return False, "import failed:\n" + "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
    location = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "?"
    try:
        Path(location).resolve().relative_to(venv.resolve())
    except ValueError:
        return False, f"import {top} found {location}, not the installed wheel"
    return True, f"import {top} ({', '.join(modules) or 'no extensions'}) from {location}"


# ----------------------------------------------------------------------------------------------------
# The checks


def _read_metadata(text: str):
    return email.parser.Parser().parsestr(text)


def _extension_module(path: str) -> str:
    """``sageattention/_fused.cpython-311-x86_64-linux-gnu.so`` -> ``sageattention._fused``."""
    pure = PurePosixPath(path)
    stem = pure.name.split(".")[0]
    return ".".join([*pure.parent.parts, stem])


def verify_wheel(path: Path, matrix: Matrix, options: VerifyOptions) -> Report:
    report = Report(path.name)
    try:
        _verify(path, matrix, options, report)
    except SagebuildError as exc:
        report.fail(str(exc))
    return report


def _verify(path: Path, matrix: Matrix, options: VerifyOptions, report: Report) -> None:
    # 1. the name
    try:
        name = tags.parse_wheel_name(
            path.name, matrix.torch, matrix.cuda, matrix.wheel_platforms(), matrix.naming()
        )
    except TagError as exc:
        report.fail(f"file name: {exc}")
        return
    package = matrix.package(name.project)
    label = package.display
    report.ok(f"{label} version: {name.public_version}")
    if name.kind == "build-tag":
        digits, cuda_digits = name.build.split(".")
        report.ok(f"PyTorch version tag: {digits} ({name.torch})")
        report.ok(f"CUDA version tag: {cuda_digits} ({name.cuda})")
    elif name.kind == "local-version":
        report.ok(f"local version: +{Version(name.version).local} (PyTorch {name.torch}, CUDA {name.cuda})")
    if name.python:
        report.ok(f"Python version: {name.python_tag[2:]} ({name.python})")
        report.ok(f"platform: {name.platform_tag} ({name.platform})")
        try:
            matrix.check_combo(name.project, name.platform, name.torch, name.cuda, name.python)
            report.ok(f"combination: PyTorch {name.torch} ships CUDA {name.cuda} for Python {name.python}")
        except MatrixError as exc:
            report.fail(f"combination: {exc}")
    else:
        report.ok(f"pure-Python wheel ({name.python_tag}-none-any)")
    if not path.is_file():
        report.fail(f"{path}: no such file")
        return

    # 2. archive, RECORD, METADATA, WHEEL
    try:
        wheel = WheelFile(str(path))
    except (WheelError, zipfile.BadZipFile, OSError) as exc:
        report.fail(f"archive: {exc}")
        return
    with wheel:
        contents: dict[str, bytes] = {}
        bad = []
        for info in wheel.infolist():
            if info.is_dir():
                continue
            try:
                with wheel.open(info) as handle:
                    contents[info.filename] = handle.read()
            except WheelError as exc:
                bad.append(str(exc))
        record_path = f"{wheel.dist_info_path}/RECORD"
        listed = set()
        for line in contents.get(record_path, b"").decode("utf-8").splitlines():
            if line.strip():
                listed.add(line.split(",")[0])
        missing = sorted(p for p in listed if p not in contents)
        if missing:
            bad.append(f"listed but absent: {', '.join(missing[:5])}")
        report.expect(
            not bad, f"RECORD: {len(contents)} files, every hash matches", "RECORD: " + "; ".join(bad[:5])
        )
        metadata_text = contents.get(f"{wheel.dist_info_path}/METADATA")
        wheel_text = contents.get(f"{wheel.dist_info_path}/WHEEL")
    if metadata_text is None or wheel_text is None:
        report.fail("METADATA or WHEEL is missing from the .dist-info folder")
        return
    metadata = _read_metadata(metadata_text.decode("utf-8"))
    meta_name, meta_version = canonicalize_name(metadata.get("Name", "")), metadata.get("Version", "")
    report.expect(
        meta_name == name.project and Version(meta_version) == Version(name.version),
        f"METADATA: {metadata.get('Name')} {meta_version}",
        f"METADATA says {metadata.get('Name')} {meta_version}, "
        f"the file name says {name.project} {name.version}",
    )
    _check_torch_pin(metadata.get_all("Requires-Dist") or [], name, report)
    wheel_meta = _read_metadata(wheel_text.decode("utf-8"))
    wheel_tags = sorted(wheel_meta.get_all("Tag") or [])
    name_tags = sorted(
        f"{i}-{a}-{p}"
        for i in name.python_tag.split(".")
        for a in [name.abi_tag]
        for p in name.platform_tag.split(".")
    )
    pure_root = (wheel_meta.get("Root-Is-Purelib") or "").strip().lower() == "true"
    problems = []
    if (wheel_meta.get("Build") or None) != name.build:
        problems.append(f"Build {wheel_meta.get('Build')!r} != file name's {name.build!r}")
    if wheel_tags != name_tags:
        problems.append(f"Tag {', '.join(wheel_tags)} != file name's {', '.join(name_tags)}")
    if pure_root != (name.kind == "pure"):
        problems.append(
            f"Root-Is-Purelib {pure_root} for a {'pure' if name.kind == 'pure' else 'platform'} wheel"
        )
    report.expect(
        not problems,
        f"WHEEL: build {name.build or '(none)'}, tag {', '.join(wheel_tags)}",
        "WHEEL: " + "; ".join(problems),
    )

    # 3. compiled modules and their archs
    extensions = {_extension_module(p): p for p in contents if EXTENSION_RE.search(p)}
    expected = _check_build_info(contents, name, package.name, matrix, options, extensions, report)
    if expected is not None:
        _check_sass(path, contents, extensions, expected, options, report, matrix, name)

    # 4. install and import
    if not options.smoke:
        report.skip(f"smoke test: skipped ({options.smoke_skip_reason})")
        return
    python = options.smoke_python
    if python is None:
        if name.python is None:
            python = sys.executable
        else:
            try:
                python = str(envs.find_python(name.python))
            except SagebuildError as exc:
                report.fail(f"smoke test: {exc} (or pass --smoke-python)")
                return
    with tempfile.TemporaryDirectory(prefix="sagebuild-smoke-") as tmp:
        ok, detail = smoke_test(path, python, options, sorted(extensions), Path(tmp))
    report.expect(ok, f"smoke test: fresh venv, {detail}", f"smoke test: {detail}")


def _check_torch_pin(requires: list[str], name: tags.WheelName, report: Report) -> None:
    torch_reqs = []
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            report.fail(f"METADATA: unparsable Requires-Dist {text!r}")
            return
        if canonicalize_name(req.name) == "torch" and (
            req.marker is None or req.marker.evaluate({"extra": ""})
        ):
            torch_reqs.append(req)
    pins = [s.version for r in torch_reqs for s in r.specifier if s.operator == "==" and "*" not in s.version]
    shown = ", ".join(str(r) for r in torch_reqs) or "(none)"
    if name.kind == "pure":
        report.expect(
            bool(torch_reqs) and not pins,
            f"METADATA: Requires-Dist {shown} (unpinned, as a pure wheel should be)",
            f"METADATA: a pure wheel should require torch without an exact pin, has {shown}",
        )
    elif name.kind == "build-tag":
        report.expect(
            pins == [name.torch],
            f"METADATA: Requires-Dist {shown} (matches the build tag)",
            f"METADATA: Requires-Dist {shown}, but the build tag says torch=={name.torch}",
        )
    elif pins:
        report.expect(
            pins == [name.torch],
            f"METADATA: Requires-Dist {shown} (matches the local version)",
            f"METADATA: Requires-Dist {shown}, but the local version says torch {name.torch}",
        )
    else:
        report.ok(f"METADATA: Requires-Dist {shown} (no exact torch pin)")


def _check_build_info(contents, name, package, matrix, options, extensions, report):
    """Compare what the wheel says it holds (and what the matrix would build) with what it holds.

    Returns {module: expected archs} for the SASS check, or None when there is nothing to compare.
    """
    info_path = next((p for p in contents if p.endswith(f"/{BUILD_INFO}") and p.count("/") == 1), None)
    info = None
    if info_path:
        try:
            info = json.loads(contents[info_path])
        except ValueError:
            report.fail(f"{info_path}: not valid JSON")
            return None
    if name.kind == "pure":
        if extensions:
            report.fail(f"a pure wheel holds compiled modules: {', '.join(sorted(extensions))}")
        else:
            report.ok("no compiled modules (pure-Python wheel)")
        if options.expect_archs:
            report.fail(f"--expect-archs {';'.join(options.expect_archs)} given for a pure wheel")
        return None
    claimed = None
    if info is not None:
        claimed = list(info.get("archs") or [])
        problems = []
        if info.get("torch") not in (None, name.torch):
            problems.append(f"torch {info.get('torch')} != {name.torch}")
        if info.get("torch_cuda") not in (None, name.cuda):
            problems.append(f"torch CUDA {info.get('torch_cuda')} != {name.cuda}")
        report.expect(
            not problems,
            f"build info: archs {';'.join(claimed) or '(none)'}, nvcc {info.get('nvcc')}",
            f"build info disagrees with the name: {'; '.join(problems)}",
        )
    if options.expect_archs:
        expected_archs = sort_archs(options.expect_archs)
        if claimed is not None:
            report.expect(
                sort_archs(claimed) == expected_archs,
                f"archs {';'.join(expected_archs)} as expected",
                f"the wheel was built for {';'.join(claimed)}, expected {';'.join(expected_archs)}",
            )
        claimed = expected_archs
    pkg = matrix.package(package)
    if claimed is None and not pkg.extensions:
        # a package without an extension table here (sageattn3 builds with its own setup.py)
        claimed = [a for a in pkg.default_archs if a in matrix.cuda_release(name.cuda).archs]
        report.ok(f"archs {';'.join(claimed)} (the {package} defaults in build-matrix.yaml)")
    if claimed is None:
        report.fail(f"cannot tell which archs this wheel claims: no {BUILD_INFO} in it; pass --expect-archs")
        return None
    try:
        for arch in claimed:
            if arch not in matrix.cuda_release(name.cuda).archs:
                report.fail(f"arch {arch}: {matrix.why_cuda_cannot(arch, name.cuda)}")
    except MatrixError as exc:
        report.fail(str(exc))
    plans = {p.name: list(p.archs) for p in matrix.extension_plan(package, claimed) if p.archs}
    if not pkg.extensions:
        plans = {module: sort_archs(claimed) for module in extensions}
    if info is not None:
        built = {k: sort_archs(v) for k, v in (info.get("extensions") or {}).items()}
        for module, archs in sorted(built.items()):
            if module in plans and plans[module] != archs:
                report.fail(
                    f"{module}: build info says {';'.join(archs)}, the matrix gives {';'.join(plans[module])}"
                )
            elif module not in plans:
                report.fail(f"{module}: not an extension the matrix builds for {';'.join(claimed)}")
        skipped = info.get("skipped") or {}
        for module, why in sorted(skipped.items()):
            report.skip(f"{module}: not built ({why})")
    else:
        built = plans
    expected = {}
    for module, archs in sorted(built.items()):
        if module in extensions:
            report.ok(f"extension {module}: present")
            expected[module] = archs
        else:
            report.fail(f"extension {module}: missing from the wheel")
    for module in sorted(set(extensions) - set(built)):
        report.fail(f"extension {module}: in the wheel but not in its build info")
    if not built and not extensions:
        report.ok("no compiled modules (no kernel sources were present at build time)")
    return expected


def _check_sass(path, contents, extensions, expected, options, report, matrix, name):
    if not expected:
        return
    cuda = name.cuda
    min_cuda = tuple(int(x) for x in cuda.split(".")[:2]) if cuda else None
    cuobjdump = find_cuobjdump(options, min_cuda)
    if cuobjdump is None and options.fetch_cuobjdump and options.cache_dir is not None:
        requirement = next(iter(matrix.cuda_release(name.cuda).pip.cuobjdump), "nvidia-cuda-cuobjdump")
        cuobjdump = fetch_cuobjdump(options.cache_dir, requirement)
    if cuobjdump is None:
        message = (
            f"no cuobjdump{f' of CUDA {cuda} or newer' if cuda else ''} found (looked for --cuobjdump, "
            "$SAGEBUILD_CUOBJDUMP, the CUDA toolkit, PATH, .sagebuild/tools, nvidia-cuda-cuobjdump and "
            "triton in site-packages); "
            "use --fetch-cuobjdump to install nvidia-cuda-cuobjdump, or --cuobjdump PATH"
        )
        if options.allow_missing_cuobjdump:
            report.skip(f"SASS check skipped: {message}")
        else:
            report.fail(f"SASS check: {message}, or --allow-missing-cuobjdump to skip it")
        return
    with tempfile.TemporaryDirectory(prefix="sagebuild-sass-") as tmp:
        for module, archs in sorted(expected.items()):
            member = extensions[module]
            binary = Path(tmp) / PurePosixPath(member).name
            binary.write_bytes(contents[member])
            sass, ptx = sass_archs(cuobjdump, binary)
            want = [Arch.parse(a).sm for a in archs]
            got = [Arch.parse(a).sm for a in sass]
            extra = f"; PTX {', '.join(ptx)}" if ptx else ""
            report.expect(
                sorted(got) == sorted(want),
                f"SASS {member}: {', '.join(got)}{extra}",
                f"SASS {member}: has {', '.join(got) or 'none'}, expected exactly {', '.join(want)}{extra}",
            )


def verify_paths(paths: Sequence[Path], matrix: Matrix, options: VerifyOptions) -> list[Report]:
    reports = []
    for path in paths:
        report = verify_wheel(Path(path), matrix, options)
        print(report.render(), flush=True)
        reports.append(report)
    return reports
