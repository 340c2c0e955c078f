"""Environments and processes: finding interpreters, venvs, pip, CUDA toolkits, progress output.

Everything here works on Linux and Windows: paths go through pathlib, commands are argument lists
(never shell strings), and the venv layout (bin/ vs Scripts/) is chosen per platform.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePath, PurePosixPath, PureWindowsPath

from .errors import SagebuildError

GIB = 1024**3
#: One parallel compile job per this much free memory: a CUDA TU with torch headers peaks near 3 GiB.
MEMORY_PER_JOB = 4 * GIB


def is_windows(system: str | None = None) -> bool:
    return (system or sys.platform).lower() in ("win32", "windows", "nt")


def machine_platform_tag() -> str:
    """The wheel platform tag of this interpreter as built: ``linux_x86_64``, ``linux_aarch64``,
    ``win_amd64`` (macOS: ``macosx_14_0_arm64``)."""
    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


def current_platform(wheel_platforms: Mapping[str, str]) -> str | None:
    """Our platform name for this machine: the one of ``wheel_platforms`` (name -> wheel tag, the
    matrix's platforms) whose tag is this interpreter's; None where none is (macOS)."""
    tag = machine_platform_tag()
    return next((name for name, wheel in wheel_platforms.items() if wheel == tag), None)


def pure_path(path: str | PurePath, windows: bool | None = None) -> PurePath:
    windows = is_windows() if windows is None else windows
    return PureWindowsPath(path) if windows else PurePosixPath(path)


def venv_python(venv: str | PurePath, windows: bool | None = None) -> PurePath:
    """The interpreter of a venv: ``Scripts\\python.exe`` on Windows, ``bin/python`` elsewhere."""
    windows = is_windows() if windows is None else windows
    root = pure_path(venv, windows)
    return root / "Scripts" / "python.exe" if windows else root / "bin" / "python"


def exe_name(name: str, windows: bool | None = None) -> str:
    windows = is_windows() if windows is None else windows
    return f"{name}.exe" if windows and not name.lower().endswith(".exe") else name


def file_uri(path: str | PurePath, windows: bool | None = None) -> str:
    """``file://`` URL of an absolute path (``file:///C:/wheels`` on Windows)."""
    windows = is_windows() if windows is None else windows
    pure = pure_path(path, windows)
    if not pure.is_absolute():
        if pure_path(os.getcwd(), windows).is_absolute():
            pure = pure_path(os.path.abspath(str(path)), windows)
        else:
            raise SagebuildError(f"{path} is not an absolute path")
    return pure.as_uri()


# ----------------------------------------------------------------------------------------------------
# Progress output


class Progress:
    """Step-by-step output with wall-clock time and time since start: ``[12:01:02 +1:23] step``."""

    def __init__(self, stream=None) -> None:
        self.start = time.monotonic()
        self.stream = stream or sys.stdout

    def _stamp(self) -> str:
        elapsed = int(time.monotonic() - self.start)
        now = _dt.datetime.now().strftime("%H:%M:%S")
        return f"[{now} +{elapsed // 60}:{elapsed % 60:02d}]"

    def log(self, message: str) -> None:
        print(f"{self._stamp()} {message}", file=self.stream, flush=True)

    def detail(self, message: str) -> None:
        print(f"{' ' * 18}{message}", file=self.stream, flush=True)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        began = time.monotonic()
        self.log(f"== {name}")
        try:
            yield
        except BaseException:
            self.log(f"!! {name}: failed after {time.monotonic() - began:.1f}s")
            raise
        self.log(f"   {name}: done in {time.monotonic() - began:.1f}s")

    def elapsed(self) -> float:
        return time.monotonic() - self.start


# ----------------------------------------------------------------------------------------------------
# Running commands


def _printable(cmd: Sequence[str]) -> str:
    return " ".join(f'"{c}"' if " " in str(c) else str(c) for c in cmd)


def run(
    cmd: Sequence[str | PurePath],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    capture: bool = False,
    log_file: Path | None = None,
    progress: Progress | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """Run a command (argument list). With ``log_file`` output is shown and also saved there."""
    cmd = [str(c) for c in cmd]
    if progress is not None:
        progress.detail(f"$ {_printable(cmd)}")
    try:
        if capture:
            result = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, errors="replace")
        elif log_file is not None:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            with open(log_file, "w", encoding="utf-8", errors="replace") as log:
                proc = subprocess.Popen(
                    cmd,
                    env=env,
                    cwd=cwd,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    errors="replace",
                )
                assert proc.stdout is not None
                for line in proc.stdout:
                    sys.stdout.write(line)
                    log.write(line)
                sys.stdout.flush()
                result = subprocess.CompletedProcess(cmd, proc.wait())
        else:
            result = subprocess.run(cmd, env=env, cwd=cwd)
    except FileNotFoundError as exc:
        raise SagebuildError(f"cannot run {cmd[0]}: {exc.strerror}") from exc
    if check and result.returncode != 0:
        tail = ""
        if capture:
            tail = "\n" + "\n".join((result.stdout + result.stderr).strip().splitlines()[-30:])
        elif log_file is not None:
            tail = f"\n(full output: {log_file})"
        raise SagebuildError(f"command failed with exit code {result.returncode}: {_printable(cmd)}{tail}")
    return result


def clean_env(extra: Mapping[str, str] | None = None, drop: Sequence[str] = ()) -> dict[str, str]:
    """A copy of os.environ without variables that would leak the caller's environment into a venv."""
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "PIP_REQUIRE_VIRTUALENV", *drop):
        env.pop(name, None)
    env["PYTHONNOUSERSITE"] = "1"
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    if extra:
        env.update(extra)
    return env


# ----------------------------------------------------------------------------------------------------
# Interpreters and venvs


def python_version_of(exe: str | Path) -> str | None:
    """``3.11`` for a working interpreter, None when it does not run."""
    try:
        out = subprocess.run(
            [str(exe), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _candidate_pythons(version: str) -> Iterator[Path]:
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == version:
        yield Path(sys.executable)
    for name in (f"python{version}", f"python{version.replace('.', '')}"):
        found = shutil.which(name)
        if found:
            yield Path(found)
    if is_windows():
        launcher = shutil.which("py")
        if launcher:
            out = subprocess.run(
                [launcher, f"-{version}", "-c", "import sys; print(sys.executable)"],
                capture_output=True,
                text=True,
            )
            if out.returncode == 0 and out.stdout.strip():
                yield Path(out.stdout.strip())
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    for prefix in sorted((pyenv_root / "versions").glob(f"{version}.*"), reverse=True):
        yield prefix / ("python.exe" if is_windows() else f"bin/python{version}")


def find_python(version: str, explicit: str | Path | None = None) -> Path:
    """An interpreter for Python ``version``; ``explicit`` (--python-exe) wins and is checked."""
    if explicit:
        found = python_version_of(explicit)
        if found is None:
            raise SagebuildError(f"--python-exe {explicit} does not run")
        if found != version:
            raise SagebuildError(f"--python-exe {explicit} is Python {found}, but the target needs {version}")
        return Path(explicit)
    tried = []
    for candidate in _candidate_pythons(version):
        tried.append(str(candidate))
        if python_version_of(candidate) == version:
            return candidate
    hint = f"py install {version}" if is_windows() else f"pyenv install {version} (or your OS package)"
    raise SagebuildError(
        f"no Python {version} interpreter found (tried: {', '.join(tried) or 'nothing on PATH'}). "
        f"Install one ({hint}) or pass --python-exe PATH"
    )


def create_venv(
    python: str | Path, path: Path, progress: Progress | None = None, with_pip: bool = True
) -> Path:
    """A new venv at ``path`` (replacing any old one); returns its interpreter."""
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(python), "-m", "venv", str(path)]
    if not with_pip:
        cmd.append("--without-pip")
    run(cmd, progress=progress, env=clean_env())
    exe = Path(venv_python(path))
    if not exe.exists():
        raise SagebuildError(f"venv at {path} has no interpreter at {exe}")
    return exe


def site_packages(python: str | Path) -> Path:
    out = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture=True)
    return Path(out.stdout.strip())


def pip(
    python: str | Path,
    args: Sequence[str],
    *,
    progress: Progress | None = None,
    quiet: bool = True,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess:
    cmd = [str(python), "-m", "pip", *args]
    if quiet and args and args[0] in ("install", "download", "wheel"):
        cmd.insert(4, "-q")
    return run(cmd, progress=progress, env=clean_env(env))


def index_args(index_url: str | None) -> list[str]:
    return ["--index-url", index_url] if index_url else []


def torch_index(cuda_tag: str, explicit: str | None = None) -> str | None:
    """The index to install torch from: --index-url, else SAGEBUILD_TORCH_INDEX (a template with
    ``{cuda_tag}``, e.g. ``.../{cuda_tag}``), else None (pip's own configured index)."""
    if explicit:
        return explicit
    template = os.environ.get("SAGEBUILD_TORCH_INDEX", "").strip()
    if not template:
        return None
    try:
        return template.format(cuda_tag=cuda_tag, cuda=cuda_tag[2:])
    except (KeyError, IndexError) as exc:
        raise SagebuildError(f"SAGEBUILD_TORCH_INDEX={template!r}: unknown placeholder {exc}") from exc


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of a file, read in 1 MiB blocks (wheels run to hundreds of MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_marker(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_marker(path: Path, data: dict) -> None:
    """Write a JSON marker atomically (temporary file, then rename): a process killed while writing
    leaves the old marker or none, never half of one."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(partial, path)


# ----------------------------------------------------------------------------------------------------
# Parallelism


def available_memory() -> int | None:
    """Bytes of memory available for new work, or None when it cannot be told."""
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    if is_windows():
        import ctypes  # noqa: PLC0415

        class MemoryStatus(ctypes.Structure):
            _fields_ = [
                ("dwLength", ctypes.c_ulong),
                ("dwMemoryLoad", ctypes.c_ulong),
                ("ullTotalPhys", ctypes.c_ulonglong),
                ("ullAvailPhys", ctypes.c_ulonglong),
                ("ullTotalPageFile", ctypes.c_ulonglong),
                ("ullAvailPageFile", ctypes.c_ulonglong),
                ("ullTotalVirtual", ctypes.c_ulonglong),
                ("ullAvailVirtual", ctypes.c_ulonglong),
                ("ullAvailExtendedVirtual", ctypes.c_ulonglong),
            ]

        status = MemoryStatus()
        status.dwLength = ctypes.sizeof(MemoryStatus)
        if ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status)):  # type: ignore[attr-defined]
            return int(status.ullAvailPhys)
    return None


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_parallelism(
    n_archs: int,
    cores: int | None = None,
    memory: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[int, int]:
    """(MAX_JOBS, NVCC_THREADS): from the environment when set, else one job per 4 GiB of available
    memory, at most one per core; nvcc threads split an arch list over the cores left per job."""
    environ = os.environ if environ is None else environ
    cores = cores or cpu_count()
    memory = available_memory() if memory is None else memory
    budget = cores if memory is None else max(1, memory // MEMORY_PER_JOB)
    jobs_text = environ.get("MAX_JOBS", "").strip()
    jobs = int(jobs_text) if jobs_text.isdigit() and int(jobs_text) > 0 else max(1, min(cores, budget))
    threads_text = environ.get("NVCC_THREADS", "").strip()
    if threads_text.isdigit() and int(threads_text) > 0:
        threads = int(threads_text)
    else:
        threads = max(1, min(n_archs, cores // jobs, budget // jobs))
    return jobs, threads


# ----------------------------------------------------------------------------------------------------
# CUDA toolkits


def nvcc_version(cuda_home: str | Path) -> tuple[str, str] | None:
    """(``13.0``, ``13.0.88``) for the nvcc of a toolkit, None when there is none."""
    exe = Path(cuda_home) / "bin" / exe_name("nvcc")
    if not exe.exists():
        return None
    try:
        out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"release (\d+)\.(\d+), V([\d.]+)", out)
    return (f"{match.group(1)}.{match.group(2)}", match.group(3)) if match else None


def is_toolkit(home: str | Path | None) -> bool:
    """A folder with nvcc and the CUDA runtime headers (a wrapper script's folder is not one)."""
    if not home:
        return False
    home = Path(home)
    return (home / "bin" / exe_name("nvcc")).is_file() and (home / "include" / "cuda_runtime.h").is_file()


def detect_cuda_home() -> Path | None:
    """The machine's toolkit: CUDA_HOME / CUDA_PATH, nvcc on PATH, then the usual install place."""
    candidates: list[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]))
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates += [Path(nvcc).resolve().parent.parent, Path(nvcc).parent.parent]
    if is_windows():
        root = Path("C:/Program Files/NVIDIA GPU Computing Toolkit/CUDA")
        candidates += sorted(root.glob("v*"), key=lambda p: p.name, reverse=True)
    else:
        candidates.append(Path("/usr/local/cuda"))
    for candidate in candidates:
        if is_toolkit(candidate) and nvcc_version(candidate):
            return candidate
    return None


def finish_pip_toolkit(home: Path) -> None:
    """Make a toolkit assembled from pip packages look like an installed one to nvcc and torch:
    nvcc's profile links from lib64, and ``-lcudart`` needs an unversioned libcudart.so."""
    lib = home / "lib"
    if is_windows() or not lib.is_dir():
        return
    if not (home / "lib64").exists():
        (home / "lib64").symlink_to("lib", target_is_directory=True)
    if not (lib / "libcudart.so").exists():
        versioned = sorted(lib.glob("libcudart.so.*"))
        if versioned:
            (lib / "libcudart.so").symlink_to(versioned[0].name)


def merge_roots(target: Path, roots: Sequence[Path]) -> Path:
    """One CUDA_HOME from several package folders (CUDA 12 packages each bring their own)."""
    if len(roots) == 1:
        return roots[0]
    merged = target / "merged"
    if merged.exists():
        shutil.rmtree(merged)
    for root in roots:
        shutil.copytree(root, merged, dirs_exist_ok=True, symlinks=True)
    return merged
