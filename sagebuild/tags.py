"""Wheel naming: the ``{torch}.{cuda}`` build tag, the ``+cu128torch2.9.0`` local version, Python tags.

Encoding is plain concatenation of version digits (torch 2.8.0 -> ``280``, CUDA 12.9 -> ``129``), so
decoding is ambiguous in general (``2141`` could be 2.14.1 or 2.1.41). Decoding therefore lists every
way of splitting the digits into version parts (no part with a leading zero) and keeps the ones that
are releases known to build-matrix.yaml: exactly one must remain.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from .errors import TagError

LOCAL_VERSION_RE = re.compile(r"^cu(?P<cuda>\d+)torch(?P<torch>\d+\.\d+\.\d+)$")
BUILD_TAG_RE = re.compile(r"^(?P<torch>\d+)\.(?P<cuda>\d+)$")
PYTHON_TAG_RE = re.compile(r"^cp3(?P<minor>\d{1,2})$")
#: A Linux platform tag, as built (linux_aarch64) or repaired (manylinux_2_28_aarch64): its CPU.
MANYLINUX_RE = re.compile(
    r"^(?:manylinux_\d+_\d+|manylinux2014|manylinux2010|manylinux1|linux)_(?P<arch>\w+)$"
)


def release_parts(version: str, count: int) -> tuple[int, ...]:
    """``"2.8.0"`` -> ``(2, 8, 0)``; pads with zeros, rejects pre/post/dev/local parts."""
    try:
        parsed = Version(version)
    except InvalidVersion as exc:
        raise TagError(f"{version!r} is not a version") from exc
    if parsed.pre or parsed.post is not None or parsed.dev is not None or parsed.local or parsed.epoch:
        raise TagError(f"{version!r}: only plain release versions (like 2.8.0) can be encoded")
    release = tuple(parsed.release) + (0,) * count
    if len(parsed.release) > count:
        raise TagError(f"{version!r} has more than {count} parts")
    return release[:count]


def torch_tag(torch: str) -> str:
    """PyTorch 2.8.0 -> ``280``; 2.14.1 -> ``2141``."""
    return "".join(str(p) for p in release_parts(torch, 3))


def cuda_digits(cuda: str) -> str:
    """CUDA 12.9 -> ``129``."""
    return "".join(str(p) for p in release_parts(cuda, 2))


def cuda_tag(cuda: str) -> str:
    """CUDA 12.8 -> ``cu128`` (the name PyTorch's CUDA indexes use)."""
    return "cu" + cuda_digits(cuda)


def build_tag(torch: str, cuda: str) -> str:
    """The PEP 427 build tag of a sageattention wheel: ``{torch}.{cuda}``, e.g. ``280.129``."""
    return f"{torch_tag(torch)}.{cuda_digits(cuda)}"


def local_version(torch: str, cuda: str) -> str:
    """The local version label of a sageattn3 wheel: ``cu128torch2.9.0``."""
    release_parts(torch, 3)
    return f"{cuda_tag(cuda)}torch{torch}"


def cuda_line(cuda: str) -> str:
    """CUDA 12.8 -> ``12``: the line an abi3 wheel serves (its runtime is linked statically, and one
    driver of the line runs every minor version's code)."""
    return str(release_parts(cuda, 2)[0])


def cuda_line_tag(cuda: str) -> str:
    """CUDA 12.8 -> ``cu12``: the local version of an abi3 wheel of a line other than the default."""
    return f"cu{cuda_line(cuda)}"


def abi3_python_tag(python_floor: str) -> str:
    """Python 3.9 -> ``cp39``: the first tag of an abi3 wheel (every CPython from it on takes the wheel)."""
    return python_tag(python_floor)


def python_tag(python: str) -> str:
    """Python 3.12 -> ``cp312``."""
    major, minor = release_parts(python, 2)
    return f"cp{major}{minor}"


def decode_python_tag(tag: str) -> str:
    """``cp312`` -> ``3.12``."""
    match = PYTHON_TAG_RE.match(tag)
    if not match:
        raise TagError(f"Python tag {tag!r} is not a CPython tag like cp312")
    return f"3.{int(match.group('minor'))}"


def _splits(digits: str, parts: int) -> list[tuple[int, ...]]:
    """Every way to cut ``digits`` into ``parts`` numbers without leading zeros."""
    if parts == 1:
        if digits and (digits == "0" or not digits.startswith("0")):
            return [(int(digits),)]
        return []
    out = []
    for cut in range(1, len(digits) - parts + 2):
        head = digits[:cut]
        if len(head) > 1 and head.startswith("0"):
            continue
        for rest in _splits(digits[cut:], parts - 1):
            out.append((int(head),) + rest)
    return out


def _decode(digits: str, parts: int, known: Iterable[str], what: str) -> str:
    if not digits.isdigit():
        raise TagError(f"{what} tag {digits!r} must be digits only")
    known_by_parts = {}
    for version in known:
        known_by_parts[release_parts(version, parts)] = version
    candidates = _splits(digits, parts)
    if not candidates:
        raise TagError(f"{what} tag {digits!r} is too short to hold {parts} version parts")
    matches = [known_by_parts[c] for c in candidates if c in known_by_parts]
    readings = ", ".join(".".join(str(p) for p in c) for c in candidates)
    if not matches:
        raise TagError(
            f"{what} tag {digits!r} does not name a {what} version in build-matrix.yaml "
            f"(it could be read as {readings})"
        )
    if len(matches) > 1:
        raise TagError(f"{what} tag {digits!r} is ambiguous: it reads as {' or '.join(matches)}")
    return matches[0]


def decode_torch_tag(digits: str, known_torch: Iterable[str]) -> str:
    """``280`` -> ``2.8.0`` given the known PyTorch releases."""
    return _decode(digits, 3, known_torch, "PyTorch")


def decode_cuda_digits(digits: str, known_cuda: Iterable[str]) -> str:
    """``129`` -> ``12.9`` given the known CUDA versions."""
    return _decode(digits, 2, known_cuda, "CUDA")


def decode_build_tag(tag: str, known_torch: Iterable[str], known_cuda: Iterable[str]) -> tuple[str, str]:
    """``280.129`` -> ``("2.8.0", "12.9")``."""
    match = BUILD_TAG_RE.match(tag)
    if not match:
        raise TagError(
            f"build tag {tag!r} is not {{torch}}.{{cuda}} digits (like 280.129 for PyTorch 2.8.0 + CUDA 12.9)"
        )
    return (
        decode_torch_tag(match.group("torch"), known_torch),
        decode_cuda_digits(match.group("cuda"), known_cuda),
    )


def decode_local_version(
    local: str, known_torch: Iterable[str], known_cuda: Iterable[str]
) -> tuple[str, str]:
    """``cu128torch2.9.0`` -> ``("2.9.0", "12.8")``."""
    match = LOCAL_VERSION_RE.match(local)
    if not match:
        raise TagError(f"local version {local!r} is not cu{{cuda}}torch{{version}} (like cu128torch2.9.0)")
    torch = match.group("torch")
    if torch not in set(known_torch):
        raise TagError(f"local version {local!r} names PyTorch {torch}, which is not in build-matrix.yaml")
    return torch, decode_cuda_digits(match.group("cuda"), known_cuda)


def _parse_abi3(
    filename, project, version, build_text, interpreters, platforms, wheel_platforms, spec, known_cuda
):
    if spec is None:
        raise TagError(
            f"{filename}: {project} has no abi3 wheels (build-matrix.yaml has no abi3 entry for it)"
        )
    want = abi3_python_tag(spec["python_floor"])
    if interpreters != {want}:
        raise TagError(
            f"{filename}: an abi3 wheel of {project} is tagged {want}-abi3, not {'.'.join(interpreters)}"
        )
    if build_text:
        raise TagError(
            f"{filename}: an abi3 wheel serves every torch and carries no {{torch}}.{{cuda}} build tag"
        )
    platform_names = {platform_of_tag(p, wheel_platforms) for p in platforms}
    if None in platform_names or len(platform_names) != 1:
        raise TagError(f"{filename}: platform tag {'.'.join(sorted(platforms))} is not one of ours")
    lines = sorted({cuda_line(c) for c in known_cuda}, key=int)
    local = version.local
    if local is None:
        line = spec["default_line"]
    else:
        match = re.fullmatch(r"cu(\d+)", local)
        if not match:
            raise TagError(
                f"{filename}: an abi3 wheel's local version is its CUDA line, cu12 or cu13, not +{local}"
            )
        line = match.group(1)
        if line == spec["default_line"]:
            raise TagError(
                f"{filename}: CUDA {line} is the default line, "
                f"whose wheels carry no local version (+cu{line})"
            )
    if line not in lines:
        raise TagError(
            f"{filename}: CUDA line {line} is not in build-matrix.yaml (lines: {', '.join(lines)})"
        )
    (platform,) = platform_names
    return WheelName(filename, project, str(version), "abi3", None, want, "abi3", ".".join(sorted(platforms)),
                     platform, None, line, decode_python_tag(want))  # fmt: skip


def platform_of_tag(tag: str, wheel_platforms: dict[str, str]) -> str | None:
    """Which of our platforms a wheel platform tag belongs to: the one with that wheel tag, or for a
    manylinux tag the one whose wheel tag is ``linux_`` with the same CPU (``manylinux_2_28_x86_64``
    -> linux, ``manylinux_2_28_aarch64`` -> the platform of ``linux_aarch64``)."""
    for name, wheel_platform in wheel_platforms.items():
        if tag == wheel_platform:
            return name
    match = MANYLINUX_RE.match(tag)
    if match:
        for name, wheel_platform in wheel_platforms.items():
            if wheel_platform == f"linux_{match.group('arch')}":
                return name
    return None


@dataclass(frozen=True)
class WheelName:
    """A decoded wheel file name."""

    filename: str
    project: str  # canonical project name
    version: str  # full version, local part included
    kind: str  # "build-tag", "local-version", "abi3" or "pure"
    build: str | None
    python_tag: str
    abi_tag: str
    platform_tag: str
    platform: str | None  # linux / windows / None for pure wheels
    torch: str | None  # None for abi3 wheels: they serve every torch from their floor on
    cuda: str | None  # abi3 wheels: the CUDA line ("13")
    python: str | None  # abi3 wheels: the oldest Python that takes them

    @property
    def public_version(self) -> str:
        return Version(self.version).public


def parse_wheel_name(
    filename: str,
    known_torch: Iterable[str],
    known_cuda: Iterable[str],
    wheel_platforms: dict[str, str],
    naming: dict[str, str] | None = None,
    abi3: dict[str, dict] | None = None,
) -> WheelName:
    """Decode a wheel file name of ours, rejecting malformed and ambiguous ones with the reason.

    ``naming`` maps canonical project names to "build-tag" or "local-version"; other projects are
    rejected. ``abi3`` maps the projects that have torch-independent wheels to their abi3 entry
    (python_floor, default_line): such a wheel is ``cpXY-abi3``, its CUDA line the local version
    ``+cuNN`` or, for the default line, none.
    """
    known_torch = list(known_torch)
    known_cuda = list(known_cuda)
    try:
        name, version, build, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        raise TagError(f"{filename}: not a valid wheel file name ({exc})") from exc
    project = canonicalize_name(name)
    if naming is not None and project not in naming:
        raise TagError(f"{filename}: project {project!r} is not built here (known: {', '.join(naming)})")
    scheme = (naming or {}).get(project, "build-tag")
    tags = sorted(tags, key=str)
    interpreters = {t.interpreter for t in tags}
    abis = {t.abi for t in tags}
    platforms = {t.platform for t in tags}
    build_text = f"{build[0]}{build[1]}" if build else None
    local = version.local

    if platforms == {"any"}:
        if abis != {"none"}:
            raise TagError(f"{filename}: a pure wheel must have ABI 'none'")
        if build_text or local:
            raise TagError(
                f"{filename}: a pure-Python wheel must not carry a build tag or local version; "
                "either it contains compiled code (then its platform tag is wrong) or the tag is"
            )
        return WheelName(
            filename,
            project,
            str(version),
            "pure",
            None,
            ".".join(sorted(interpreters)),
            "none",
            "any",
            None,
            None,
            None,
            None,
        )

    if abis == {"abi3"}:
        return _parse_abi3(filename, project, version, build_text, interpreters, platforms, wheel_platforms,
                           (abi3 or {}).get(project), known_cuda)  # fmt: skip

    if len(interpreters) != 1 or len(abis) != 1:
        raise TagError(
            f"{filename}: a CUDA wheel must be built for exactly one Python (got {sorted(interpreters)})"
        )
    (interpreter,) = interpreters
    (abi,) = abis
    python = decode_python_tag(interpreter)
    if abi != interpreter:
        raise TagError(f"{filename}: ABI tag {abi!r} does not match Python tag {interpreter!r}")
    platform_names = {platform_of_tag(p, wheel_platforms) for p in platforms}
    if None in platform_names or len(platform_names) != 1:
        raise TagError(
            f"{filename}: platform tag {'.'.join(sorted(platforms))} is not one of ours "
            f"({', '.join(wheel_platforms.values())}, or a manylinux tag of a linux_* one)"
        )
    (platform,) = platform_names
    platform_tag = ".".join(sorted(platforms))

    if scheme == "build-tag":
        if local:
            raise TagError(
                f"{filename}: {project} wheels carry the {{torch}}.{{cuda}} build tag, not a local version"
            )
        if not build_text:
            raise TagError(
                f"{filename}: a {project} platform wheel must carry the {{torch}}.{{cuda}} build tag "
                "(like 280.129); without it nothing says which PyTorch and CUDA it was built for"
            )
        torch, cuda = decode_build_tag(build_text, known_torch, known_cuda)
    else:
        if build_text:
            raise TagError(
                f"{filename}: {project} wheels carry a local version (+cu128torch2.9.0), not a build tag"
            )
        if not local:
            raise TagError(
                f"{filename}: a {project} wheel must carry the local version +cu{{cuda}}torch{{version}} "
                "(like +cu128torch2.9.0)"
            )
        torch, cuda = decode_local_version(local, known_torch, known_cuda)
    return WheelName(
        filename,
        project,
        str(version),
        scheme,
        build_text,
        interpreter,
        abi,
        platform_tag,
        platform,
        torch,
        cuda,
        python,
    )
