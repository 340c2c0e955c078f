"""``sagebuild verify``: check a wheel's name, metadata, RECORD, compiled archs, and that it installs.

Every check prints one line with a mark; the result fails when any check fails.
"""

from __future__ import annotations

import email.parser
import hashlib
import json
import os
import re
import shutil
import struct
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

from . import envs, key_loops, tags
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
    status: str  # "pass" | "fail" | "skip" | "note" (a fact worth knowing that fails nothing)
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

    def note(self, label: str) -> None:
        self.checks.append(Check("note", label))

    def expect(self, condition: bool, good: str, bad: str) -> bool:
        (self.ok if condition else self.fail)(good if condition else bad)
        return condition

    @property
    def passed(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    def render(self) -> str:
        good, bad, skip = marks()
        sign = {"pass": good, "fail": bad, "skip": skip, "note": "!"}
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
# Shape of the compiled modules
#
# RECORD proves the bytes are the ones the build wrote, unless RECORD was rewritten with them; then a
# truncated or overwritten module is caught here: its headers must describe a shared library for the
# wheel's machine whose tables and segments all lie inside the file. (A change inside a segment that
# leaves the headers intact is RECORD's to catch, and the SASS check's when it hits the device code.)

ELF_MAGIC = b"\x7fELF"
ELF_CLASS64, ELF_LITTLE_ENDIAN, ET_DYN, PT_LOAD, SHT_NULL, SHT_NOBITS = 2, 1, 3, 1, 0, 8
ELF_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")  # Elf64_Ehdr, 64 bytes
ELF_PROGRAM_HEADER = struct.Struct("<IIQQQQQQ")  # Elf64_Phdr, 56 bytes
ELF_SECTION_HEADER = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr, 64 bytes
#: e_machine (ELF) and Machine (PE) of the CPUs our wheels are built for, by platform-tag suffix.
MACHINES = {
    "x86_64": ("x86-64", 62, 0x8664),
    "amd64": ("x86-64", 62, 0x8664),
    "aarch64": ("aarch64", 183, 0xAA64),
    "arm64": ("aarch64", 183, 0xAA64),
}
PE_DLL = 0x2000  # IMAGE_FILE_DLL
PE_SECTION_SIZE = 40


class BinaryError(ValueError):
    """A compiled module whose bytes are not a loadable library for the wheel's platform."""


def _machine_for(platform_tag: str) -> tuple[str, int, int] | None:
    for suffix, machine in MACHINES.items():
        if platform_tag.endswith(suffix):
            return machine
    return None


def _within(size: int, offset: int, length: int, what: str) -> None:
    if offset + length > size:
        raise BinaryError(f"{what} ends at byte {offset + length}, past the end of the file ({size} bytes)")


def elf_summary(data: bytes, platform_tag: str) -> str:
    """Check that ``data`` is a whole 64-bit little-endian ELF shared object for the wheel's machine."""
    size = len(data)
    if size < ELF_HEADER.size or data[:4] != ELF_MAGIC:
        raise BinaryError("not an ELF file (no ELF header)")
    ident = data[:16]
    if ident[4] != ELF_CLASS64 or ident[5] != ELF_LITTLE_ENDIAN:
        raise BinaryError(f"not a 64-bit little-endian ELF file (class {ident[4]}, data {ident[5]})")
    (_, e_type, machine, _, _, phoff, shoff, _, ehsize, phentsize, phnum, shentsize, shnum, _) = (
        ELF_HEADER.unpack_from(data)
    )
    if e_type != ET_DYN:
        raise BinaryError(f"ELF type {e_type}, not a shared object ({ET_DYN})")
    want = _machine_for(platform_tag)
    if want is not None and machine != want[1]:
        raise BinaryError(f"ELF machine {machine}, but the wheel is for {want[0]} ({want[1]})")
    if ehsize != ELF_HEADER.size:
        raise BinaryError(f"ELF header size {ehsize}, expected {ELF_HEADER.size}")
    if phnum == 0 or phentsize != ELF_PROGRAM_HEADER.size:
        raise BinaryError(f"no usable program headers ({phnum} of {phentsize} bytes)")
    _within(size, phoff, phnum * phentsize, "the program header table")
    loads = 0
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz, _, _ = ELF_PROGRAM_HEADER.unpack_from(
            data, phoff + i * phentsize
        )
        if p_type == PT_LOAD:
            loads += 1
            _within(size, p_offset, p_filesz, f"loadable segment (program header {i})")
    if not loads:
        raise BinaryError("no loadable segment")
    if shoff == 0:
        raise BinaryError("no section header table")
    if shentsize != ELF_SECTION_HEADER.size:
        raise BinaryError(f"section header size {shentsize}, expected {ELF_SECTION_HEADER.size}")
    _within(size, shoff, shentsize, "the section header table")
    if shnum == 0:  # more than 0xff00 sections: the count is in section 0's sh_size
        shnum = ELF_SECTION_HEADER.unpack_from(data, shoff)[5]
    _within(size, shoff, shnum * shentsize, "the section header table")
    for i in range(1, shnum):
        _, sh_type, _, _, sh_offset, sh_size, _, _, _, _ = ELF_SECTION_HEADER.unpack_from(
            data, shoff + i * shentsize
        )
        if sh_type not in (SHT_NULL, SHT_NOBITS):
            _within(size, sh_offset, sh_size, f"section {i}")
    name = want[0] if want else f"machine {machine}"
    return f"ELF64 {name} shared object, {loads} loadable segments, {shnum} sections"


def pe_summary(data: bytes, platform_tag: str) -> str:
    """Check that ``data`` is a whole PE DLL for the wheel's machine (a Windows ``.pyd``)."""
    size = len(data)
    if size < 0x40 or data[:2] != b"MZ":
        raise BinaryError("not a PE file (no MZ header)")
    (pe,) = struct.unpack_from("<I", data, 0x3C)
    _within(size, pe, 24, "the PE header")
    if data[pe : pe + 4] != b"PE\0\0":
        raise BinaryError("not a PE file (no PE signature)")
    machine, sections, _, _, _, optional_size, characteristics = struct.unpack_from("<HHIIIHH", data, pe + 4)
    want = _machine_for(platform_tag)
    if want is not None and machine != want[2]:
        raise BinaryError(f"PE machine {machine:#x}, but the wheel is for {want[0]} ({want[2]:#x})")
    if not characteristics & PE_DLL:
        raise BinaryError("a PE file that is not a DLL")
    table = pe + 24 + optional_size
    _within(size, table, sections * PE_SECTION_SIZE, "the section table")
    for i in range(sections):
        raw_size, raw_offset = struct.unpack_from("<II", data, table + i * PE_SECTION_SIZE + 16)
        _within(size, raw_offset, raw_size, f"section {i}")
    name = want[0] if want else f"machine {machine:#x}"
    return f"PE {name} DLL, {sections} sections"


def binary_summary(member: str, data: bytes, platform_tag: str) -> str:
    """One line on a compiled module, or BinaryError saying what is wrong with it."""
    return (pe_summary if member.endswith(".pyd") else elf_summary)(data, platform_tag)


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
        name = matrix.parse_wheel_name(path.name)
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
    if name.kind == "abi3":
        local = Version(name.version).local
        report.ok(
            f"abi3 wheel: CUDA {name.cuda}.x line "
            f"({'+' + local if local else 'the default line, no local version'}), "
            f"every torch >= {package.abi3['torch_floor']}, CPython >= {name.python}"
        )
        report.ok(f"platform: {name.platform_tag} ({name.platform})")
        report.expect(
            bool(matrix.cuda_of_line(name.cuda)),
            f"CUDA line {name.cuda}: toolkits {', '.join(matrix.cuda_of_line(name.cuda))}",
            f"CUDA line {name.cuda}: no toolkit of it in build-matrix.yaml",
        )
    elif name.python:
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
        unreadable = set()
        for info in wheel.infolist():
            if info.is_dir():
                continue
            try:
                with wheel.open(info) as handle:
                    contents[info.filename] = handle.read()
            except (WheelError, zipfile.BadZipFile, OSError) as exc:  # a hash or a CRC that does not match
                bad.append(str(exc))
                unreadable.add(info.filename)
        record_path = f"{wheel.dist_info_path}/RECORD"
        listed = set()
        for line in contents.get(record_path, b"").decode("utf-8").splitlines():
            if line.strip():
                listed.add(line.split(",")[0])
        missing = sorted(p for p in listed if p not in contents and p not in unreadable)
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
    _check_torch_pin(metadata.get_all("Requires-Dist") or [], name, report, package.abi3)
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

    # 3. compiled modules: whole libraries for this platform, the ones the build info lists, their archs
    extensions = {_extension_module(p): p for p in [*contents, *unreadable] if EXTENSION_RE.search(p)}
    if name.kind != "pure":
        for member in sorted(extensions.values()):
            if member not in contents:
                report.fail(f"binary {member}: unreadable (its RECORD hash or CRC does not match)")
                continue
            try:
                summary = binary_summary(member, contents[member], name.platform_tag)
            except BinaryError as exc:
                report.fail(f"binary {member}: {exc}")
            else:
                report.ok(f"binary {member}: {summary}")
    if name.kind != "pure" and package.torch_independent:
        for member in sorted(extensions.values()):
            if member in contents:
                _check_torch_free(member, contents[member], report)
    if name.kind == "abi3":
        _check_abi3_claim(path, name, report)
    expected = _check_build_info(contents, name, package.name, matrix, options, extensions, report)
    if expected is not None:
        _check_sass(path, contents, extensions, expected, options, report, matrix, name)

    # 4. install and import
    if not options.smoke:
        report.skip(f"smoke test: skipped ({options.smoke_skip_reason})")
        return
    python = options.smoke_python
    running = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if python is None:
        # An abi3 wheel installs on every CPython from its floor on: this one, where it is new enough.
        abi3_fits = name.kind == "abi3" and tuple(map(int, running.split("."))) >= tuple(
            map(int, name.python.split("."))
        )
        if name.python is None or abi3_fits:
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


#: Mangled C++ names of libtorch's namespaces (c10::, at::, torch::, caffe2::), in what a module imports.
_TORCH_SYMBOL_RE = re.compile(r"^_ZN?K?(?:St\d+)?\d*(?:3c10|2at|5torch|6caffe2)")
_TORCH_LIBRARY_RE = re.compile(r"^(libtorch|libc10|libcaffe2|libshm)|^(torch|c10)\w*\.dll$", re.IGNORECASE)


def torch_imports(data: bytes) -> tuple[list[str], list[str]]:
    """(NEEDED libraries, undefined dynamic symbols) of an ELF module; ([], []) for another format."""
    if not data.startswith(b"\x7fELF"):
        return [], []
    import io  # noqa: PLC0415

    from elftools.elf.dynamic import DynamicSection  # noqa: PLC0415
    from elftools.elf.elffile import ELFFile  # noqa: PLC0415

    elf = ELFFile(io.BytesIO(data))
    needed, undefined = [], []
    for section in elf.iter_sections():
        if isinstance(section, DynamicSection):
            needed += [tag.needed for tag in section.iter_tags() if tag.entry.d_tag == "DT_NEEDED"]
        if section.name == ".dynsym":
            undefined += [s.name for s in section.iter_symbols() if s.name and s["st_shndx"] == "SHN_UNDEF"]
    return needed, undefined


def _check_torch_free(member: str, data: bytes, report: Report) -> None:
    """A module of a torch-independent package imports nothing of libtorch: no NEEDED libtorch / libc10,
    no mangled c10:: / at:: / torch:: symbol (it would tie the wheel to that torch's C++ ABI)."""
    try:
        needed, undefined = torch_imports(data)
    except Exception as exc:  # noqa: BLE001 - pyelftools raises many kinds on a damaged file
        report.fail(f"torch-free {member}: cannot read its dynamic section ({type(exc).__name__}: {exc})")
        return
    libs = [n for n in needed if _TORCH_LIBRARY_RE.search(n)]
    symbols = [s for s in undefined if _TORCH_SYMBOL_RE.search(s)]
    problems = []
    if libs:
        problems.append(f"NEEDED {', '.join(libs)}")
    if symbols:
        problems.append(f"{len(symbols)} libtorch C++ symbols, e.g. {', '.join(symbols[:3])}")
    report.expect(
        not problems,
        f"torch-free {member}: links no libtorch, imports no c10/at/torch symbol "
        f"(NEEDED {', '.join(needed) or '-'})",
        f"torch-free {member}: the wheel claims to serve every torch, but the module imports libtorch: "
        + "; ".join(problems),
    )


def _check_abi3_claim(path: Path, name: tags.WheelName, report: Report) -> None:
    """abi3audit: every Python symbol the modules import is in the limited API of the abi3 tag's Python."""
    cmd = [sys.executable, "-m", "abi3audit", "--assume-minimum-abi3", name.python, "--strict", str(path)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        report.fail(f"abi3 claim: abi3audit did not run ({exc})")
        return
    if "No module named abi3audit" in proc.stderr:
        report.fail(
            "abi3 claim: abi3audit is not installed (pip install abi3audit; requirements-dev.txt pins it)"
        )
        return
    detail = (proc.stdout + proc.stderr).strip().splitlines()
    report.expect(
        proc.returncode == 0,
        f"abi3 claim: abi3audit finds only limited-API symbols of CPython {name.python}",
        "abi3 claim: abi3audit: " + " | ".join(detail[-6:]),
    )


def _check_torch_pin(
    requires: list[str], name: tags.WheelName, report: Report, abi3: dict | None = None
) -> None:
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
    if name.kind == "abi3":
        floor = (abi3 or {}).get("torch_floor")
        specs = [str(s) for r in torch_reqs for s in r.specifier]
        report.expect(
            specs == [f">={floor}"],
            f"METADATA: Requires-Dist {shown} (the abi3 floor, never an exact pin)",
            f"METADATA: an abi3 wheel requires torch>={floor} and nothing else of torch, has {shown}",
        )
    elif name.kind == "pure":
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
    toolkit = name.cuda  # the CUDA whose archs the wheel may hold
    if name.kind == "abi3":
        nvcc = str((info or {}).get("nvcc") or "")
        toolkit = ".".join(nvcc.split(".")[:2]) if nvcc else (matrix.cuda_of_line(name.cuda) or [None])[-1]
    if info is not None:
        claimed = list(info.get("archs") or [])
        problems = []
        if name.kind == "abi3":
            if info.get("wheel_kind") != "abi3":
                problems.append(f"wheel kind {info.get('wheel_kind')!r} != 'abi3'")
            if str(info.get("cuda_line")) != name.cuda:
                problems.append(f"CUDA line {info.get('cuda_line')} != {name.cuda}")
        else:
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
        claimed = [a for a in pkg.default_archs if a in matrix.cuda_release(toolkit).archs]
        report.ok(f"archs {';'.join(claimed)} (the {package} defaults in build-matrix.yaml)")
    if claimed is None:
        report.fail(f"cannot tell which archs this wheel claims: no {BUILD_INFO} in it; pass --expect-archs")
        return None
    try:
        for arch in claimed:
            if arch not in matrix.cuda_release(toolkit).archs:
                report.fail(f"arch {arch}: {matrix.why_cuda_cannot(arch, toolkit)}")
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
    cuda = name.cuda if name.kind != "abi3" else (matrix.cuda_of_line(name.cuda) or [None])[0]
    min_cuda = tuple(int(x) for x in cuda.split(".")[:2]) if cuda else None
    cuobjdump = find_cuobjdump(options, min_cuda)
    if cuobjdump is None and options.fetch_cuobjdump and options.cache_dir is not None:
        requirement = next(iter(matrix.cuda_release(cuda).pip.cuobjdump), "nvidia-cuda-cuobjdump")
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
            if member not in contents:
                continue  # unreadable: reported by the RECORD and binary checks
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
            if "sm_90a" in got and module.endswith("._qattn_sm90"):
                source_root = matrix.root / matrix.package(name.project).source_dir
                _check_key_loops(cuobjdump, binary, member, source_root, report)


def _check_key_loops(cuobjdump: Path, binary: Path, member: str, source_root: Path, report: Report) -> None:
    """Whether the sm_90a attention kernels carry the key loops whose speed was measured. Another ptxas
    schedules the same source differently (CUDA 12.6-13.5: 0.5-16% slower), so a wheel with other loops
    is correct but its Hopper speed unmeasured: a note, not a failure."""
    try:
        recorded = key_loops.load_record(source_root)
    except (OSError, ValueError) as exc:
        report.skip(f"sm_90a key loops: no record to compare with ({exc})")
        return
    proc = subprocess.run([str(cuobjdump), "-sass", str(binary)], capture_output=True, text=True)
    if proc.returncode != 0:
        report.fail(f"sm_90a key loops: {cuobjdump} -sass {member} failed: {proc.stderr.strip()}")
        return
    try:
        current = key_loops.key_loops([proc.stdout])
    except ValueError as exc:
        report.fail(f"sm_90a key loops: {member}: {exc}")
        return
    differ = key_loops.compare(current, recorded)
    where = f"{key_loops.RECORD.as_posix()}, nvcc {recorded.get('nvcc')}"
    if not differ:
        report.ok(f"sm_90a key loops: the {len(current)} measured ones ({where})")
        return
    report.note(
        f"sm_90a key loops: {len(differ)} of {len(recorded['kernels'])} differ from the measured ones "
        f"({where}); this wheel's Hopper speed is unmeasured (bench/NOTES.md, run y: other toolkits' "
        "loops ran 0.5-16% slower):\n      " + "\n      ".join(differ)
    )


def verify_paths(paths: Sequence[Path], matrix: Matrix, options: VerifyOptions) -> list[Report]:
    reports = []
    for path in paths:
        report = verify_wheel(Path(path), matrix, options)
        print(report.render(), flush=True)
        reports.append(report)
    return reports


# ----------------------------------------------------------------------------------------------------
# Comparing two builds (``sagebuild diff``)
#
# Two builds of the same source in the same environment give the same wheel, byte for byte, except for
# the compiled modules (object code is not guaranteed to be reproducible: paths, build ids, the
# compiler's own choices) and, because of them, the RECORD lines that hash them. Everything else
# differing means the builds were not the same: other sources, other tools, or time stamps leaking in
# (sagebuild sets SOURCE_DATE_EPOCH so that they do not).


@dataclass
class MemberDiff:
    member: str
    what: str
    expected: bool  # a difference that two builds of one source may show


@dataclass
class WheelDiff:
    a: Path
    b: Path
    identical_bytes: bool
    same_members: int = 0
    differences: list[MemberDiff] = field(default_factory=list)

    @property
    def unexpected(self) -> list[MemberDiff]:
        return [d for d in self.differences if not d.expected]

    def render(self) -> str:
        good, bad, _ = marks()
        lines = [f"Comparing wheels:\n  A: {self.a}\n  B: {self.b}"]
        if self.identical_bytes:
            lines.append(f"  {good} byte-identical")
            return "\n".join(lines)
        lines.append(f"  {good} {self.same_members} members identical (contents, time stamp, mode)")
        for d in self.differences:
            lines.append(f"  {'~' if d.expected else bad} {d.member}: {d.what}")
        if self.unexpected:
            lines.append(f"  => DIFFERENT ({len(self.unexpected)} unexpected differences)")
        elif self.differences:
            lines.append("  => identical apart from compiled objects (expected to differ between builds)")
        else:
            lines.append("  => same members and contents; the archives differ only in how they are stored")
        return "\n".join(lines)


def _is_compiled(member: str) -> bool:
    return bool(EXTENSION_RE.search(member))


def _zip_time(info: zipfile.ZipInfo) -> str:
    return "{:04d}-{:02d}-{:02d} {:02d}:{:02d}:{:02d}".format(*info.date_time)


def _record_rows(data: bytes) -> dict[str, str]:
    rows = {}
    for line in data.decode("utf-8", errors="replace").splitlines():
        if line.strip():
            path, _, rest = line.partition(",")
            rows[path] = rest
    return rows


def _record_diff(a: bytes, b: bytes) -> tuple[str, bool]:
    """How two RECORDs differ, and whether that is expected (only lines that hash compiled objects)."""
    rows_a, rows_b = _record_rows(a), _record_rows(b)
    changed = sorted(p for p in set(rows_a) | set(rows_b) if rows_a.get(p) != rows_b.get(p))
    if not changed:
        return "the same lines in another order", False
    other = [p for p in changed if not _is_compiled(p)]
    if other:
        return f"differs in the lines of {', '.join(other[:5])}", False
    return "differs only in the hashes of compiled objects (expected)", True


def compare_wheels(a: Path, b: Path) -> WheelDiff:
    """Which members of two wheels differ, and whether each difference is one builds may show."""
    a, b = Path(a), Path(b)
    for path in (a, b):
        if not path.is_file():
            raise SagebuildError(f"{path}: no such file")
    diff = WheelDiff(a, b, a.read_bytes() == b.read_bytes())
    if diff.identical_bytes:
        return diff
    if a.name != b.name:
        diff.differences.append(MemberDiff("(file name)", f"{a.name} != {b.name}", False))
    try:
        with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
            infos_a = {i.filename: i for i in za.infolist()}
            infos_b = {i.filename: i for i in zb.infolist()}
            for member in sorted(set(infos_a) | set(infos_b)):
                if member not in infos_b or member not in infos_a:
                    side = "A" if member in infos_a else "B"
                    diff.differences.append(MemberDiff(member, f"only in {side}", False))
                    continue
                ia, ib = infos_a[member], infos_b[member]
                data_a, data_b = za.read(ia), zb.read(ib)
                problems = []
                expected = False
                if data_a != data_b:
                    if _is_compiled(member):
                        expected = True
                        problems.append(
                            f"contents differ ({len(data_a)} / {len(data_b)} bytes, sha256 "
                            f"{hashlib.sha256(data_a).hexdigest()[:12]} / "
                            f"{hashlib.sha256(data_b).hexdigest()[:12]}): a compiled object, "
                            "expected to differ between builds"
                        )
                    elif member.endswith(".dist-info/RECORD"):
                        what, expected = _record_diff(data_a, data_b)
                        problems.append(what)
                    else:
                        problems.append(f"contents differ ({len(data_a)} / {len(data_b)} bytes)")
                if ia.date_time != ib.date_time:
                    expected = False
                    problems.append(
                        f"time stamp {_zip_time(ia)} / {_zip_time(ib)} (is SOURCE_DATE_EPOCH set?)"
                    )
                if ia.external_attr != ib.external_attr:
                    expected = False
                    problems.append(f"mode {ia.external_attr >> 16:o} / {ib.external_attr >> 16:o}")
                if problems:
                    diff.differences.append(MemberDiff(member, "; ".join(problems), expected))
                else:
                    diff.same_members += 1
            if set(infos_a) == set(infos_b) and list(infos_a) != list(infos_b):
                diff.differences.append(
                    MemberDiff("(archive)", "the members are stored in another order", False)
                )
    except zipfile.BadZipFile as exc:
        raise SagebuildError(f"not a readable wheel: {exc}") from exc
    return diff
