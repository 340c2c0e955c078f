"""build-matrix.yaml: loading, validation, arch rules, profiles and build targets.

setup.py imports this module too, so it needs nothing beyond PyYAML and packaging.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import tags
from .errors import MatrixError, TagError

REPO_ROOT = Path(__file__).resolve().parent.parent
MATRIX_FILE = "build-matrix.yaml"
#: How a package's compiled modules meet the framework (build-matrix.yaml, packages.*.binding).
BINDINGS = ("c-abi", "torch-cpp")

_ARCH_RE = re.compile(r"^(?P<major>\d{1,2})\.(?P<minor>\d)(?P<suffix>[af]?)$")
_SM_RE = re.compile(r"^sm_(?P<number>\d{2,3})(?P<suffix>[af]?)$")


def _vkey(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in str(version).split("."))


def _listify(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def _join(items: Iterable[str]) -> str:
    items = list(items)
    return ", ".join(items) if items else "(none)"


_COMBO_KEYS = ("torch", "cuda", "python")


def _explain(raw_notes: Iterable[dict], dropped: list, with_sets: bool = False) -> list[dict[str, Any]]:
    """``left_out`` notes (``{torch/cuda/python: which, why}``, keys left out match all), each with the
    dropped combinations it explains. ``dropped``: (set, (torch, cuda, python), why it is dropped).
    ``combos`` holds (torch, cuda, python), or with ``with_sets`` (set, (torch, cuda, python))."""
    notes = []
    for raw in raw_notes:
        keys = {k: _listify(raw.get(k)) for k in _COMBO_KEYS}
        hits = [
            (name, combo, fact)
            for name, combo, fact in dropped
            if all(not keys[k] or combo[i] in keys[k] for i, k in enumerate(_COMBO_KEYS))
        ]
        note = {
            **keys,
            "why": " ".join(str(raw.get("why") or "").split()),
            "combos": [(name, combo) if with_sets else combo for name, combo, _ in hits],
            "facts": list(dict.fromkeys(fact for _, _, fact in hits)),
            "hits": hits,  # (set, combo, fact)
        }
        if with_sets:
            note["sets"] = list(dict.fromkeys(name for name, _, _ in hits))
        notes.append(note)
    return notes


def _check_notes(
    where: str, drops: str, notes: list[dict], dropped: list, fix: str, errors: list[str]
) -> None:
    """Every note gives a why and explains something; every dropped (set, combo, fact) has a note."""
    explained = {(name, combo) for note in notes for name, combo, _ in note["hits"]}
    for note in notes:
        label = ", ".join(f"{k} {'/'.join(note[k])}" for k in _COMBO_KEYS if note[k]) or "everything"
        if not note["why"]:
            errors.append(f"{where}: the left_out note for {label} gives no why")
        if not note["combos"]:
            errors.append(
                f"{where}: the left_out note for {label} matches no combination that {drops} (a stale note?)"
            )
    for name, (torch, cuda, python), fact in dropped:
        if (name, (torch, cuda, python)) not in explained:
            errors.append(
                f"set {name}: {drops} torch {torch} + CUDA {cuda} + Python {python} ({fact}); {fix} "
                "(BUILD_MATRIX.md shows it)"
            )


# ----------------------------------------------------------------------------------------------------
# Architectures


@dataclass(frozen=True)
class Arch:
    """A CUDA target as written in TORCH_CUDA_ARCH_LIST: ``8.9``, ``9.0a``, ``12.0a``."""

    major: int
    minor: int
    suffix: str = ""

    @classmethod
    def parse(cls, text: str) -> Arch:
        text = str(text).strip()
        match = _ARCH_RE.match(text)
        if match:
            return cls(int(match.group("major")), int(match.group("minor")), match.group("suffix"))
        sm = _SM_RE.match(text)
        if sm:
            number = sm.group("number")
            return cls(int(number[:-1]), int(number[-1]), sm.group("suffix"))
        if "+PTX" in text.upper():
            raise MatrixError(
                f"arch {text!r}: +PTX is not built; sageattention ships SASS for each arch only"
            )
        raise MatrixError(f"arch {text!r} is not of the form 8.9 / 9.0a / 12.0a")

    @property
    def name(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}"

    @property
    def number(self) -> int:
        return self.major * 10 + self.minor

    @property
    def sm(self) -> str:
        return f"sm_{self.number}{self.suffix}"

    @property
    def compute(self) -> str:
        return f"compute_{self.number}{self.suffix}"

    @property
    def gencode(self) -> str:
        return f"-gencode=arch={self.compute},code={self.sm}"

    @property
    def sort_key(self) -> tuple[int, str]:
        return (self.number, self.suffix)

    def __str__(self) -> str:
        return self.name


def parse_arch_list(text: str | Sequence[str] | None) -> list[str]:
    """``"8.0;8.9 9.0a"`` -> ``["8.0", "8.9", "9.0a"]`` (sorted, de-duplicated, validated)."""
    if text is None:
        return []
    parts = re.split(r"[;,\s]+", text) if isinstance(text, str) else [str(t) for t in text]
    archs = {Arch.parse(p) for p in parts if p.strip()}
    return [a.name for a in sorted(archs, key=lambda a: a.sort_key)]


def sort_archs(archs: Iterable[str]) -> list[str]:
    return [a.name for a in sorted({Arch.parse(x) for x in archs}, key=lambda a: a.sort_key)]


# ----------------------------------------------------------------------------------------------------
# Data model


@dataclass(frozen=True)
class Platform:
    name: str
    system: str
    wheel_platform: str
    repair_platform: str | None
    runner: str
    docker_platform: str | None = None  # Linux: the platform Docker Bake builds for (linux/amd64)
    manylinux_image: str | None = None  # Linux: the manylinux image of repair_platform (Docker Bake)
    #: Notes on the combinations the sets list that PyTorch publishes no build of for this platform
    #: (``{torch/cuda/python: which, why: ...}``, as a set's ``left_out``).
    left_out: tuple[dict[str, Any], ...] = ()

    @property
    def machine(self) -> str:
        """The CPU of the wheel tag: linux_aarch64 -> aarch64, win_amd64 -> amd64."""
        return self.wheel_platform.partition("_")[2]


@dataclass(frozen=True)
class PipToolkit:
    nvcc: tuple[str, ...]
    cudart: tuple[str, ...]
    headers: tuple[str, ...]
    cuobjdump: tuple[str, ...]
    roots: tuple[str, ...]
    unusable: str | None
    platforms: tuple[str, ...] | None = None  # whose wheels the package index has (None: every one)

    @property
    def compiler_packages(self) -> tuple[str, ...]:
        return self.nvcc + self.cudart + self.headers

    def serves(self, platform: str) -> bool:
        """Whether the package index has these packages' wheels for ``platform``."""
        return self.platforms is None or platform in self.platforms


@dataclass(frozen=True)
class CudaRelease:
    version: str
    archs: tuple[str, ...]
    pip: PipToolkit

    @property
    def tag(self) -> str:
        return tags.cuda_tag(self.version)

    @property
    def digits(self) -> str:
        return tags.cuda_digits(self.version)


@dataclass(frozen=True)
class TorchRelease:
    version: str
    cuda: tuple[str, ...]
    python: tuple[str, ...]
    registry_cuda: dict[str, str | None]
    source: str
    #: The CUDA builds on a platform that has fewer of them than ``cuda`` (a platform not named has all).
    platform_cuda: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def cuda_on(self, platform: str | None) -> tuple[str, ...]:
        """The CUDA builds of this release for ``platform`` (None: every build of any platform)."""
        if platform is None or platform not in self.platform_cuda:
            return self.cuda
        return self.platform_cuda[platform]


@dataclass(frozen=True)
class Extension:
    name: str
    kernels: tuple[str, ...]
    shared: tuple[str, ...]
    define: dict[str, str]
    archs: Any  # "all" | {"min": "8.0"} | [list]

    def select(self, archs: Iterable[str]) -> list[str]:
        """The requested archs that get SASS in this module."""
        chosen = []
        for name in archs:
            arch = Arch.parse(name)
            if self.archs == "all":
                keep = True
            elif isinstance(self.archs, dict):
                keep = arch.number >= Arch.parse(self.archs["min"]).number
            else:
                keep = arch.name in {Arch.parse(a).name for a in self.archs}
            if keep:
                chosen.append(arch.name)
        return sort_archs(chosen)

    def describe_filter(self) -> str:
        if self.archs == "all":
            return "every requested arch"
        if isinstance(self.archs, dict):
            return f"archs >= {self.archs['min']}"
        return ", ".join(self.archs)


@dataclass(frozen=True)
class ExtensionPlan:
    name: str
    archs: tuple[str, ...]
    sources: tuple[str, ...]
    skipped: str | None
    define: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Package:
    name: str
    source_dir: str
    version_from: str
    planned_version: str | None
    naming: str
    pure_requires: tuple[str, ...]
    min_torch: str | None
    default_archs: tuple[str, ...]
    optional_archs: tuple[str, ...]
    build: dict[str, Any]
    extensions: tuple[Extension, ...]
    binding: str = "torch-cpp"
    abi3: dict[str, str] | None = None  # torch_floor, python_floor, default_line (c-abi packages)
    # files of the repository outside source_dir that the build takes (staged at their repository paths)
    shared_files: tuple[str, ...] = ()

    @property
    def torch_independent(self) -> bool:
        """Whether its compiled modules serve every torch (their binding imports nothing of libtorch)."""
        return self.binding == "c-abi"

    @property
    def all_archs(self) -> tuple[str, ...]:
        return tuple(sort_archs(self.default_archs + self.optional_archs))

    @property
    def display(self) -> str:
        return {"sageattention": "SageAttention", "sageattn3": "SageAttn3"}.get(self.name, self.name)


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    set: str
    torch: tuple[str, ...]
    cuda: tuple[str, ...]
    python: tuple[str, ...]
    pick: str | None
    archs: tuple[str, ...]
    platforms: tuple[str, ...]


@dataclass(frozen=True)
class Target:
    """One wheel to build: package x platform x torch x CUDA x Python x archs."""

    package: str
    platform: str
    torch: str
    cuda: str
    python: str
    archs: tuple[str, ...]
    version: str
    naming: str
    wheel_platform: str
    default_archs: bool = True
    dropped_archs: tuple[str, ...] = ()
    abi3_python: str | None = None  # abi3 wheels: the cpXY of the tag
    abi3_local: str | None = None  # abi3 wheels: the local version of a CUDA line other than the default
    torch_floor: str | None = None  # abi3 wheels: METADATA's torch>=

    @property
    def torch_id(self) -> str:
        major, minor, patch = tags.release_parts(self.torch, 3)
        return f"{major}{minor}" + (str(patch) if patch else "")

    @property
    def id(self) -> str:
        if self.naming == "abi3":
            python = self.python.replace(".", "")
            base = f"{self.platform}-{self.package}-abi3-{tags.cuda_tag(self.cuda)}-python{python}"
            if not self.default_archs:
                base += "".join("-" + Arch.parse(a).sm.replace("_", "") for a in self.archs)
            return base
        base = (
            f"{self.platform}-{self.package}-pytorch{self.torch_id}-{tags.cuda_tag(self.cuda)}"
            f"-python{self.python.replace('.', '')}"
        )
        if not self.default_archs:
            base += "".join("-" + Arch.parse(a).sm.replace("_", "") for a in self.archs)
        return base

    @property
    def build_tag(self) -> str | None:
        return tags.build_tag(self.torch, self.cuda) if self.naming == "build-tag" else None

    @property
    def local_version(self) -> str | None:
        if self.naming == "abi3":
            return self.abi3_local
        return tags.local_version(self.torch, self.cuda) if self.naming == "local-version" else None

    @property
    def python_tag(self) -> str:
        return tags.python_tag(self.python)

    @property
    def wheel_tag(self) -> str:
        if self.naming == "abi3":
            return f"{self.abi3_python}-abi3-{self.wheel_platform}"
        return f"{self.python_tag}-{self.python_tag}-{self.wheel_platform}"

    @property
    def full_version(self) -> str:
        return f"{self.version}+{self.local_version}" if self.local_version else self.version

    @property
    def wheel_name(self) -> str:
        dist = self.package.replace("-", "_")
        build = f"-{self.build_tag}" if self.build_tag else ""
        return f"{dist}-{self.full_version}{build}-{self.wheel_tag}.whl"

    @property
    def arch_list(self) -> str:
        return ";".join(self.archs)

    def to_dict(self, runner: str | None = None) -> dict[str, Any]:
        data = {
            "id": self.id,
            "package": self.package,
            "version": self.full_version,
            "platform": self.platform,
            "torch": self.torch,
            "cuda": self.cuda,
            "cuda_tag": tags.cuda_tag(self.cuda),
            "python": self.python,
            "archs": self.arch_list,
            "build_tag": self.build_tag or "",
            "local_version": self.local_version or "",
            "wheel_tag": self.wheel_tag,
            "wheel": self.wheel_name,
            "wheel_kind": "abi3" if self.naming == "abi3" else "pinned",
        }
        if runner is not None:
            data["runner"] = runner
        return data


# ----------------------------------------------------------------------------------------------------
# Reading versions from pyproject.toml (Python 3.9+: tomllib only from 3.11)


def read_project_version(pyproject: Path) -> str:
    text = pyproject.read_text(encoding="utf-8")
    try:
        import tomllib  # noqa: PLC0415 (3.11+)
    except ImportError:
        tomllib = None
    if tomllib is not None:
        version = tomllib.loads(text).get("project", {}).get("version")
        if not version:
            raise MatrixError(f"{pyproject}: [project] has no static version")
        return str(version)
    in_project = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            in_project = stripped == "[project]"
            continue
        match = re.match(r'^version\s*=\s*["\']([^"\']+)["\']', stripped)
        if in_project and match:
            return match.group(1)
    raise MatrixError(f"{pyproject}: [project] has no static version")


def read_build_requires(pyproject: Path) -> list[str]:
    """The ``[build-system] requires`` list of a pyproject.toml."""
    text = pyproject.read_text(encoding="utf-8")
    try:
        import tomllib  # noqa: PLC0415 (3.11+)
    except ImportError:
        tomllib = None
    if tomllib is not None:
        return [str(r) for r in tomllib.loads(text).get("build-system", {}).get("requires", [])]
    section = re.search(r"^\[build-system\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    body = section.group(1) if section else ""
    listing = re.search(r"^requires\s*=\s*\[(.*?)\]", body, re.M | re.S)
    if not listing:
        return []
    return re.findall(r"""["']([^"']+)["']""", re.sub(r"#[^\n]*", "", listing.group(1)))


# ----------------------------------------------------------------------------------------------------
# The matrix


class Matrix:
    """The parsed and validated build matrix."""

    def __init__(self, data: dict[str, Any], root: Path | None = None, source: str = MATRIX_FILE):
        self.root = Path(root) if root is not None else REPO_ROOT
        self.source = source
        self.raw = data
        self._versions: dict[str, str] = {}
        errors: list[str] = []
        self.platforms = self._parse_platforms(data.get("platforms") or {}, errors)
        self.cuda = self._parse_cuda(data.get("cuda") or {}, errors)
        self.torch = self._parse_torch(data.get("torch") or {}, errors)
        self.packages = self._parse_packages(data.get("packages") or {}, errors)
        self.sets = data.get("sets") or {}
        self.profiles = self._parse_profiles(data.get("profiles") or {}, errors)
        self.build_env = tuple(_listify(data.get("build_env")))
        self.tools = {k: tuple(_listify(v)) for k, v in (data.get("tools") or {}).items()}
        if errors:
            raise MatrixError(f"{source} is invalid:\n  - " + "\n  - ".join(errors))
        self._validate(errors)
        if errors:
            raise MatrixError(f"{source} is invalid:\n  - " + "\n  - ".join(errors))

    # -- loading --------------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path | None = None) -> Matrix:
        path = Path(path) if path is not None else REPO_ROOT / MATRIX_FILE
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise MatrixError(f"cannot read {path}: {exc}") from exc
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise MatrixError(f"{path} is not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise MatrixError(f"{path}: expected a mapping at the top level")
        return cls(data, root=path.parent, source=path.name)

    @staticmethod
    def _parse_platforms(raw: dict, errors: list[str]) -> dict[str, Platform]:
        out = {}
        for name, spec in raw.items():
            try:
                out[name] = Platform(
                    name=name,
                    system=spec["system"],
                    wheel_platform=spec["wheel_platform"],
                    repair_platform=spec.get("repair_platform"),
                    runner=spec.get("runner", ""),
                    docker_platform=spec.get("docker_platform"),
                    manylinux_image=spec.get("manylinux_image"),
                    left_out=tuple(dict(n) for n in spec.get("left_out") or []),
                )
            except (KeyError, TypeError) as exc:
                errors.append(f"platform {name}: missing field {exc}")
        return out

    @staticmethod
    def _parse_cuda(raw: dict, errors: list[str]) -> dict[str, CudaRelease]:
        out = {}
        for version, spec in raw.items():
            version = str(version)
            if not re.match(r"^\d+\.\d+$", version):
                errors.append(f"CUDA version {version!r} must be MAJOR.MINOR (quote it in YAML)")
                continue
            archs = []
            for arch in _listify(spec.get("archs")):
                try:
                    archs.append(Arch.parse(arch).name)
                except MatrixError as exc:
                    errors.append(f"CUDA {version}: {exc}")
            pip = spec.get("pip") or {}
            out[version] = CudaRelease(
                version=version,
                archs=tuple(sort_archs(archs)) if archs else (),
                pip=PipToolkit(
                    nvcc=tuple(_listify(pip.get("nvcc"))),
                    cudart=tuple(_listify(pip.get("cudart"))),
                    headers=tuple(_listify(pip.get("headers"))),
                    cuobjdump=tuple(_listify(pip.get("cuobjdump"))),
                    roots=tuple(_listify(pip.get("roots"))),
                    unusable=pip.get("unusable"),
                    platforms=tuple(_listify(pip["platforms"])) if "platforms" in pip else None,
                ),
            )
        return dict(sorted(out.items(), key=lambda kv: _vkey(kv[0])))

    @staticmethod
    def _parse_torch(raw: dict, errors: list[str]) -> dict[str, TorchRelease]:
        out = {}
        for version, spec in raw.items():
            version = str(version)
            try:
                tags.release_parts(version, 3)
            except TagError as exc:
                errors.append(f"PyTorch {version}: {exc}")
                continue
            out[version] = TorchRelease(
                version=version,
                cuda=tuple(sorted(_listify(spec.get("cuda")), key=_vkey)),
                python=tuple(sorted(_listify(spec.get("python")), key=_vkey)),
                registry_cuda={
                    k: (str(v) if v is not None else None)
                    for k, v in (spec.get("registry_cuda") or {}).items()
                },
                source=str(spec.get("source", "")),
                platform_cuda={
                    str(k): tuple(sorted(_listify(v), key=_vkey))
                    for k, v in (spec.get("platform_cuda") or {}).items()
                },
            )
        return dict(sorted(out.items(), key=lambda kv: _vkey(kv[0])))

    @staticmethod
    def _parse_packages(raw: dict, errors: list[str]) -> dict[str, Package]:
        out = {}
        for name, spec in raw.items():
            archs = spec.get("archs") or {}
            extensions = []
            for ext in spec.get("extensions") or []:
                extensions.append(
                    Extension(
                        name=ext["name"],
                        kernels=tuple(_listify(ext.get("kernels"))),
                        shared=tuple(_listify(ext.get("shared"))),
                        define={str(k): str(v) for k, v in (ext.get("define") or {}).items()},
                        archs=ext.get("archs", "all"),
                    )
                )
            naming = spec.get("naming")
            if naming not in ("build-tag", "local-version"):
                errors.append(f"package {name}: naming must be build-tag or local-version, not {naming!r}")
            binding = str(spec.get("binding", "torch-cpp"))
            if binding not in BINDINGS:
                errors.append(f"package {name}: binding must be one of {_join(BINDINGS)}, not {binding!r}")
            abi3 = spec.get("abi3")
            if abi3 is not None:
                abi3 = {str(k): str(v) for k, v in abi3.items()}
                missing = [k for k in ("torch_floor", "python_floor", "default_line") if k not in abi3]
                if missing:
                    errors.append(f"package {name}: abi3 needs {', '.join(missing)}")
                if binding != "c-abi":
                    errors.append(
                        f"package {name}: abi3 wheels need binding c-abi "
                        f"(a {binding} module serves one torch)"
                    )
            try:
                default = sort_archs(_listify(archs.get("default")))
                optional = sort_archs(_listify(archs.get("optional")))
            except MatrixError as exc:
                errors.append(f"package {name}: {exc}")
                default, optional = [], []
            out[name] = Package(
                name=name,
                source_dir=str(spec.get("source_dir", ".")),
                version_from=str(spec.get("version_from", "pyproject.toml")),
                planned_version=str(spec["planned_version"]) if spec.get("planned_version") else None,
                naming=naming,
                pure_requires=tuple(_listify(spec.get("pure_requires"))),
                min_torch=str(spec["min_torch"]) if spec.get("min_torch") else None,
                default_archs=tuple(default),
                optional_archs=tuple(optional),
                build=dict(spec.get("build") or {}),
                extensions=tuple(extensions),
                binding=binding,
                abi3=abi3,
                shared_files=tuple(_listify(spec.get("shared_files"))),
            )
        return out

    @staticmethod
    def _parse_profiles(raw: dict, errors: list[str]) -> dict[str, Profile]:
        out = {}
        for name, spec in raw.items():
            if not re.match(r"^[a-z0-9][a-z0-9-]*$", name):
                errors.append(f"profile name {name!r}: use lowercase letters, digits and '-'")
            out[name] = Profile(
                name=name,
                description=str(spec.get("description", "")),
                set=str(spec.get("set", "")),
                torch=tuple(_listify(spec.get("torch"))),
                cuda=tuple(_listify(spec.get("cuda"))),
                python=tuple(_listify(spec.get("python"))),
                pick=spec.get("pick"),
                archs=tuple(_listify(spec.get("archs"))),
                platforms=tuple(_listify(spec.get("platforms"))),
            )
        return out

    # -- validation of the file itself -----------------------------------------------------------------

    def _validate(self, errors: list[str]) -> None:
        for platform in self.platforms.values():
            where = f"platform {platform.name}"
            if not platform.runner:
                errors.append(f"{where}: no runner (the CI runner label its builds run on)")
            if platform.system == "Linux" and platform.repair_platform:
                # Docker Bake builds the manylinux wheels of every Linux platform in its image
                if not platform.manylinux_image or not platform.docker_platform:
                    errors.append(
                        f"{where}: a Linux platform with repair_platform needs manylinux_image (the "
                        f"{platform.repair_platform} image Docker builds in) and docker_platform "
                        "(e.g. linux/amd64)"
                    )
                elif f"/{platform.repair_platform}" not in platform.manylinux_image:
                    errors.append(
                        f"{where}: manylinux_image {platform.manylinux_image!r} is not a "
                        f"{platform.repair_platform} image"
                    )
        for version, release in self.torch.items():
            for cuda in release.cuda:
                if cuda not in self.cuda:
                    errors.append(
                        f"PyTorch {version} lists CUDA {cuda}, which has no entry under cuda: "
                        f"(known: {_join(self.cuda)})"
                    )
            for key in ("registry_cuda", "platform_cuda"):  # both keyed by platform
                unknown = [p for p in getattr(release, key) if p not in self.platforms]
                errors += [f"PyTorch {version}: {key} names unknown platform {p!r}" for p in unknown]
            for platform, served in release.registry_cuda.items():
                there = release.cuda_on(platform)
                if served is not None and served not in there:
                    errors.append(
                        f"PyTorch {version}: registry_cuda says the plain index serves CUDA {served} on "
                        f"{platform}, which is not one of its CUDA builds there ({_join(there)})"
                    )
            for platform, builds in release.platform_cuda.items():
                extra = [c for c in builds if c not in release.cuda]
                if extra:
                    errors.append(
                        f"PyTorch {version}: platform_cuda gives {platform} CUDA {_join(extra)}, which is "
                        f"not among its CUDA builds ({_join(release.cuda)}): list it under cuda: too"
                    )
            for python in release.python:
                if not re.match(r"^3\.\d{1,2}$", python):
                    errors.append(f"PyTorch {version}: Python {python!r} must be 3.X (quote it in YAML)")
        for package in self.packages.values():
            for ext in package.extensions:
                spec = ext.archs
                try:
                    if isinstance(spec, dict):
                        Arch.parse(spec["min"])
                    elif spec != "all":
                        sort_archs(_listify(spec))
                except (MatrixError, KeyError, TypeError) as exc:
                    errors.append(f"package {package.name}, extension {ext.name}: bad archs filter ({exc})")
            if package.min_torch and package.min_torch not in self.torch:
                errors.append(f"package {package.name}: min_torch {package.min_torch} is not a known release")
        for version, release in self.cuda.items():
            for platform in release.pip.platforms or ():
                if platform not in self.platforms:
                    errors.append(f"CUDA {version}: pip.platforms names unknown platform {platform!r}")
        for name, spec in self.sets.items():
            if spec.get("package") not in self.packages:
                errors.append(f"set {name}: unknown package {spec.get('package')!r}")
            for entry in spec.get("builds") or []:
                for platform in _listify(entry.get("platforms")):
                    if platform not in self.platforms:
                        errors.append(f"set {name}: a build entry names unknown platform {platform!r}")
        for profile in self.profiles.values():
            if profile.set not in self.sets:
                errors.append(
                    f"profile {profile.name}: unknown set {profile.set!r} (known: {_join(self.sets)})"
                )
                continue
            for platform in profile.platforms:
                if platform not in self.platforms:
                    errors.append(f"profile {profile.name}: unknown platform {platform!r}")
            if profile.pick not in (None, "latest-python"):
                errors.append(f"profile {profile.name}: pick must be latest-python, not {profile.pick!r}")
        if errors:
            return
        for name in self.sets:
            try:
                self.set_combos(name)
                self._check_left_out(name, errors)
            except MatrixError as exc:
                errors.append(f"set {name}: {exc}")
        if errors:
            return
        for platform in self.platforms:
            self._check_platform_left_out(platform, errors)
        seen: dict[str, str] = {}
        for profile in self.profiles.values():
            try:
                targets = self.profile_targets(profile.name)
            except MatrixError as exc:
                errors.append(f"profile {profile.name}: {exc}")
                continue
            if not targets:
                errors.append(f"profile {profile.name}: selects no builds")
            for target in targets:
                owner = seen.setdefault(target.id, target.wheel_name)
                if owner != target.wheel_name:
                    errors.append(f"build id {target.id} names two different wheels")
        for version in self.torch:
            try:
                tags.decode_torch_tag(tags.torch_tag(version), self.torch)
            except TagError as exc:
                errors.append(f"PyTorch {version}: its build tag cannot be decoded: {exc}")
        for version in self.cuda:
            try:
                tags.decode_cuda_digits(tags.cuda_digits(version), self.cuda)
            except TagError as exc:
                errors.append(f"CUDA {version}: its tag cannot be decoded: {exc}")

    # -- lookups with helpful errors ---------------------------------------------------------------------

    def package(self, name: str) -> Package:
        if name not in self.packages:
            raise MatrixError(f"unknown package {name!r}; valid: {_join(self.packages)}")
        return self.packages[name]

    def platform(self, name: str) -> Platform:
        if name not in self.platforms:
            raise MatrixError(f"unknown platform {name!r}; valid: {_join(self.platforms)}")
        return self.platforms[name]

    def torch_release(self, version: str) -> TorchRelease:
        if version not in self.torch:
            raise MatrixError(
                f"PyTorch {version} is not in {self.source}; known releases: {_join(self.torch)}"
            )
        return self.torch[version]

    def cuda_release(self, version: str) -> CudaRelease:
        if version not in self.cuda:
            raise MatrixError(f"CUDA {version} is not in {self.source}; known: {_join(self.cuda)}")
        return self.cuda[version]

    def package_version(self, name: str) -> str:
        if name in self._versions:
            return self._versions[name]
        package = self.package(name)
        path = self.root / package.version_from
        if path.is_file():
            version = read_project_version(path)
        elif package.planned_version:
            version = package.planned_version
        else:
            raise MatrixError(f"package {name}: {path} does not exist and no planned_version is set")
        self._versions[name] = version
        return version

    def wheel_platforms(self) -> dict[str, str]:
        return {name: p.wheel_platform for name, p in self.platforms.items()}

    def naming(self) -> dict[str, str]:
        return {p.name: p.naming for p in self.packages.values()}

    def parse_wheel_name(self, filename: str) -> tags.WheelName:
        """A wheel file name of this matrix's packages, decoded (tags.parse_wheel_name with its facts)."""
        return tags.parse_wheel_name(
            filename, self.torch, self.cuda, self.wheel_platforms(), self.naming(), self.abi3_entries()
        )

    def abi3_entries(self) -> dict[str, dict]:
        """The abi3 entry of each package that has torch-independent wheels."""
        return {p.name: dict(p.abi3) for p in self.packages.values() if p.abi3 is not None}

    def cuda_of_line(self, line: str) -> list[str]:
        """The CUDA versions of a line ("13" -> ["13.0", "13.1"])."""
        return [c for c in self.cuda if tags.cuda_line(c) == str(line)]

    # -- arch rules ---------------------------------------------------------------------------------------

    def min_cuda_for(self, arch: str) -> str | None:
        for version, release in self.cuda.items():
            if arch in release.archs:
                return version
        return None

    def max_cuda_for(self, arch: str) -> str | None:
        found = None
        for version, release in self.cuda.items():
            if arch in release.archs:
                found = version
        return found

    def why_cuda_cannot(self, arch: str, cuda: str) -> str:
        first, last = self.min_cuda_for(arch), self.max_cuda_for(arch)
        if first is None:
            return f"no CUDA in {self.source} can target {arch}"
        if _vkey(cuda) < _vkey(first):
            return f"{arch} needs CUDA >= {first}"
        return f"CUDA {cuda} dropped {arch} (the last CUDA that targets it is {last})"

    def resolve_archs(
        self, package: str, cuda: str, requested: str | Sequence[str] | None = None
    ) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
        """The arch list for a build: (archs, dropped defaults, used the default list).

        Without ``requested``, the package's default archs that this CUDA can target. With it, every
        arch must be one of the package's archs and targetable by this CUDA, else MatrixError says why.
        """
        pkg = self.package(package)
        release = self.cuda_release(cuda)
        can = [a for a in pkg.all_archs if a in release.archs]
        if requested is None or (isinstance(requested, str) and not requested.strip()):
            archs = [a for a in pkg.default_archs if a in release.archs]
            dropped = tuple(a for a in pkg.default_archs if a not in release.archs)
            if not archs:
                raise MatrixError(
                    f"CUDA {cuda} cannot target any {package} arch ({_join(pkg.default_archs)}): "
                    + "; ".join(self.why_cuda_cannot(a, cuda) for a in pkg.default_archs)
                )
            return tuple(archs), dropped, True
        archs = parse_arch_list(requested)
        problems = []
        for arch in archs:
            if arch not in pkg.all_archs:
                hint = ""
                if Arch.parse(arch).suffix == "" and f"{arch}a" in pkg.all_archs:
                    hint = f" (did you mean {arch}a? its kernels use arch-specific instructions)"
                problems.append(f"{arch} is not a {package} arch{hint}")
            elif arch not in release.archs:
                problems.append(self.why_cuda_cannot(arch, cuda))
        if problems:
            raise MatrixError(
                f"invalid arch list {';'.join(archs)} for {package} with CUDA {cuda}: "
                + "; ".join(problems)
                + f". Valid for CUDA {cuda}: {_join(can)}"
            )
        if not archs:
            raise MatrixError("the arch list is empty")
        defaults = [a for a in pkg.default_archs if a in release.archs]
        return tuple(archs), (), list(archs) == defaults

    def extension_plan(
        self, package: str, archs: Sequence[str], source_root: Path | None = None
    ) -> list[ExtensionPlan]:
        """Which extension modules a build makes, with their archs and sources (or why skipped).

        Without ``source_root`` sources are not looked at (every extension with archs is planned).
        """
        pkg = self.package(package)
        plans = []
        for ext in pkg.extensions:
            chosen = tuple(ext.select(archs))
            kernels: list[str] = []
            if source_root is not None:
                for pattern in ext.kernels:
                    matches = sorted(glob.glob(str(Path(source_root) / pattern)))
                    kernels += [Path(m).relative_to(source_root).as_posix() for m in matches]
            skipped = None
            if source_root is not None and not kernels:
                skipped = f"no kernel sources ({_join(ext.kernels)} match nothing)"
            elif not chosen:
                skipped = f"no requested arch ({_join(archs)}) is in its filter ({ext.describe_filter()})"
            shared = []
            if source_root is not None and not skipped:
                for path in ext.shared:
                    if (Path(source_root) / path).is_file():
                        shared.append(Path(path).as_posix())
            plans.append(
                ExtensionPlan(
                    name=ext.name,
                    archs=chosen if not skipped else (),
                    sources=tuple(kernels + shared) if not skipped else (),
                    skipped=skipped,
                    define=dict(ext.define),
                )
            )
        return plans

    # -- combinations and targets ---------------------------------------------------------------------

    def check_combo(self, package: str, platform: str | None, torch: str, cuda: str, python: str) -> None:
        """Raise MatrixError saying why the combination is invalid and what would be valid (for
        ``platform``; None: on any platform)."""
        pkg = self.package(package)
        if platform is not None:
            self.platform(platform)
        release = self.torch_release(torch)
        if cuda not in release.cuda:
            raise MatrixError(
                f"PyTorch {torch} has no CUDA {cuda} build; it ships CUDA {_join(release.cuda)}"
            )
        self.cuda_release(cuda)
        if python not in release.python:
            raise MatrixError(
                f"PyTorch {torch} has no wheels for Python {python}; "
                f"it supports Python {_join(release.python)}"
            )
        if pkg.min_torch and _vkey(torch) < _vkey(pkg.min_torch):
            raise MatrixError(f"{package} needs PyTorch >= {pkg.min_torch}; got {torch}")
        there = release.cuda_on(platform)
        if cuda not in there:
            raise MatrixError(
                f"PyTorch {torch} has no CUDA {cuda} build for {platform}; there it ships CUDA "
                f"{_join(there)} (platform_cuda in {self.source})"
            )

    def make_target(
        self,
        package: str,
        platform: str,
        torch: str,
        cuda: str,
        python: str,
        archs: str | Sequence[str] | None = None,
        naming: str | None = None,
    ) -> Target:
        """One wheel to build. ``naming``: the package's own (None), or "abi3" for the torch-independent
        wheel of a package with an abi3 entry."""
        self.check_combo(package, platform, torch, cuda, python)
        chosen, dropped, is_default = self.resolve_archs(package, cuda, archs)
        pkg = self.packages[package]
        abi3 = {}
        if naming == "abi3":
            if pkg.abi3 is None:
                raise MatrixError(f"package {package} has no abi3 entry: its wheels are built per torch")
            line = tags.cuda_line(cuda)
            abi3 = {
                "abi3_python": tags.abi3_python_tag(pkg.abi3["python_floor"]),
                "abi3_local": None if line == pkg.abi3["default_line"] else tags.cuda_line_tag(cuda),
                "torch_floor": pkg.abi3["torch_floor"],
            }
        elif naming not in (None, pkg.naming):
            raise MatrixError(f"naming {naming!r}: {package} wheels are named {pkg.naming} or abi3")
        return Target(
            package=package,
            platform=platform,
            torch=torch,
            cuda=cuda,
            python=python,
            archs=chosen,
            version=self.package_version(package),
            naming=naming or pkg.naming,
            wheel_platform=self.platforms[platform].wheel_platform,
            default_archs=is_default,
            dropped_archs=dropped,
            **abi3,
        )

    def set_dropped(self, name: str) -> list[tuple[tuple[str, str, str], str]]:
        """The combinations a set lists that ``only_shipped`` leaves out, each with why (the torch
        release has no such CUDA build or no wheels for that Python)."""
        spec = self.sets[name]
        if not spec.get("only_shipped"):
            return []
        dropped = []
        for entry in spec.get("builds") or []:
            for torch in _listify(entry.get("torch")):
                release = self.torch_release(torch)
                for cuda in _listify(entry.get("cuda")):
                    for python in _listify(entry.get("python")):
                        if cuda not in release.cuda:
                            why = f"PyTorch {torch} has no CUDA {cuda} build (it ships {_join(release.cuda)})"
                        elif python not in release.python:
                            why = f"PyTorch {torch} has no wheels for Python {python}"
                        else:
                            continue
                        dropped.append(((torch, cuda, python), why))
        return dropped

    def left_out(self, name: str) -> list[dict[str, Any]]:
        """A set's ``left_out`` notes, each with the combinations it explains:
        ``{"torch": [...], "cuda": [...], "python": [...], "why": str, "combos": [(t, c, p), ...],
        "facts": [why only_shipped drops each]}``. Every combination only_shipped drops must have a
        note (checked by validation): nothing leaves a set without a word."""
        dropped = [(name, combo, fact) for combo, fact in self.set_dropped(name)]
        return _explain(self.sets[name].get("left_out") or [], dropped)

    def _check_left_out(self, name: str, errors: list[str]) -> None:
        _check_notes(
            f"set {name}", "only_shipped leaves out", self.left_out(name),
            [(name, combo, fact) for combo, fact in self.set_dropped(name)],
            "add a left_out note saying why", errors,
        )  # fmt: skip

    def _entry_combos(self, name: str, platform: str | None):
        """(torch, cuda, python) of a set's entries that apply to ``platform`` (None: every entry), as
        the releases ship them (``only_shipped``) or checked (without it), not yet narrowed to what
        ``platform`` has."""
        if name not in self.sets:
            raise MatrixError(f"unknown set {name!r}; known: {_join(self.sets)}")
        spec = self.sets[name]
        only_shipped = bool(spec.get("only_shipped"))
        for entry in spec.get("builds") or []:
            only = _listify(entry.get("platforms"))
            for plat in only:
                self.platform(plat)
            if platform is not None and only and platform not in only:
                continue
            for torch in _listify(entry.get("torch")):
                release = self.torch_release(torch)
                for cuda in _listify(entry.get("cuda")):
                    if only_shipped and cuda not in release.cuda:
                        continue
                    for python in _listify(entry.get("python")):
                        if only_shipped and python not in release.python:
                            continue
                        self.check_combo(spec["package"], None, torch, cuda, python)
                        yield torch, cuda, python

    def platform_dropped(self, name: str, platform: str) -> list[tuple[tuple[str, str, str], str]]:
        """The combinations of a set that its torch release ships, but not for ``platform`` (PyTorch
        publishes fewer CUDA builds there: ``platform_cuda``), each with why."""
        dropped = []
        for torch, cuda, python in self._entry_combos(name, platform):
            there = self.torch[torch].cuda_on(platform)
            if cuda not in there:
                fact = (
                    f"PyTorch {torch} has no CUDA {cuda} build for {platform} (it ships {_join(there)} there)"
                )
                dropped.append(((torch, cuda, python), fact))
        return dropped

    def _sets_on(self, platform: str) -> list[str]:
        """The sets that a profile builds for ``platform``."""
        names = [p.set for p in self.profiles.values() if not p.platforms or platform in p.platforms]
        return [n for n in dict.fromkeys(names) if n in self.sets]

    def _platform_drops(self, platform: str) -> list:
        """(set, combo, why) of every set a profile builds for ``platform`` that it lacks."""
        return [
            (name, combo, fact)
            for name in self._sets_on(platform)
            for combo, fact in self.platform_dropped(name, platform)
        ]

    def platform_left_out(self, platform: str) -> list[dict[str, Any]]:
        """A platform's ``left_out`` notes, each with what it explains: as ``left_out`` of a set, plus
        ``"sets"`` (the sets it explains combinations of) and ``"combos"`` as (set, (t, c, p)) pairs.
        Every combination a set lists that the platform lacks must have a note (validation)."""
        return _explain(self.platform(platform).left_out, self._platform_drops(platform), with_sets=True)

    def _check_platform_left_out(self, platform: str, errors: list[str]) -> None:
        dropped = self._platform_drops(platform)
        _check_notes(
            f"platform {platform}", f"{platform} lacks", self.platform_left_out(platform), dropped,
            f"add a left_out note under platforms.{platform} saying why", errors,
        )  # fmt: skip

    def set_combos(self, name: str, platform: str | None = None) -> list[tuple[str, str, str]]:
        """(torch, cuda, python) combinations of a build set, each checked; for ``platform``, those of
        its entries for that platform that the torch release has a build of there."""
        combos = []
        for torch, cuda, python in self._entry_combos(name, platform):
            if platform is None or cuda in self.torch[torch].cuda_on(platform):
                combos.append((torch, cuda, python))
        return combos

    def profile_targets(
        self, name: str, platform: str | None = None, package: str | None = None
    ) -> list[Target]:
        if name not in self.profiles:
            raise MatrixError(f"unknown profile {name!r}; valid profiles: {_join(self.profiles)}")
        profile = self.profiles[name]
        set_package = self.sets[profile.set]["package"]
        if package is not None:
            self.package(package)
            if package != set_package:
                return []
        platforms = list(profile.platforms or self.platforms)
        if platform is not None:
            self.platform(platform)
            platforms = [p for p in platforms if p == platform]
        naming = self.sets[profile.set].get("wheel")
        targets = []
        for plat in platforms:  # each platform has the combinations PyTorch publishes there
            for torch, cuda, python in self._profile_combos(profile, plat):
                targets.append(
                    self.make_target(
                        set_package, plat, torch, cuda, python, list(profile.archs) or None, naming
                    )
                )
        return targets

    def _profile_combos(self, profile: Profile, platform: str) -> list[tuple[str, str, str]]:
        """The (torch, cuda, python) combinations ``profile`` keeps of its set for ``platform``."""
        combos = self.set_combos(profile.set, platform)
        if profile.torch:
            combos = [c for c in combos if c[0] in profile.torch]
        if profile.cuda:
            combos = [c for c in combos if c[1] in profile.cuda]
        if profile.python:
            combos = [c for c in combos if c[2] in profile.python]
        if profile.pick == "latest-python":
            newest: dict[tuple[str, str], str] = {}
            for torch, cuda, python in combos:
                key = (torch, cuda)
                if key not in newest or _vkey(python) > _vkey(newest[key]):
                    newest[key] = python
            combos = [c for c in combos if newest[(c[0], c[1])] == c[2]]
        return combos

    def all_targets(self, package: str | None = None) -> list[Target]:
        """Every valid combination with the default archs (used to look up build ids)."""
        out = []
        for pkg in self.packages.values():
            if package is not None and pkg.name != package:
                continue
            for plat in self.platforms:
                for release in self.torch.values():
                    if pkg.min_torch and _vkey(release.version) < _vkey(pkg.min_torch):
                        continue
                    for cuda in release.cuda:
                        for python in release.python:
                            try:
                                out.append(self.make_target(pkg.name, plat, release.version, cuda, python))
                            except MatrixError:
                                continue
        return out

    def find_target(self, build_id: str) -> Target:
        """Look up a build id such as ``linux-sageattention-pytorch28-cu129-python312`` (``-sm90a``...)."""
        suffix = re.search(r"((?:-sm\d{2,3}[af]?)+)$", build_id)
        base = build_id[: suffix.start()] if suffix else build_id
        archs = None
        if suffix:
            archs = [Arch.parse("sm_" + s[2:]).name for s in suffix.group(1).split("-") if s]
        for target in self.all_targets():
            if target.id == base:
                if archs is None:
                    return target
                return self.make_target(
                    target.package, target.platform, target.torch, target.cuda, target.python, archs
                )
        for profile in self.profiles:
            for target in self.profile_targets(profile):
                if target.id == build_id:
                    return target
        raise MatrixError(
            f"unknown build id {build_id!r}: ids look like linux-sageattention-pytorch28-cu129-python312 "
            "(see `python -m sagebuild plan --profile NAME`)"
        )

    def newest_torch_for(self, cuda: str, python: str, platform: str) -> str | None:
        """The newest release with a ``cuda`` build for ``python`` on ``platform``."""
        for version in reversed(list(self.torch)):
            release = self.torch[version]
            if cuda in release.cuda_on(platform) and python in release.python:
                return version
        return None


def load(path: str | Path | None = None) -> Matrix:
    """Load and validate build-matrix.yaml (the repository's by default)."""
    return Matrix.load(path)
