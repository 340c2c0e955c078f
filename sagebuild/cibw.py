"""``sagebuild cibw``: cibuildwheel configuration for builds of the matrix (an alternative frontend).

CI builds natively with ``sagebuild build`` (seed 000). For people who prefer cibuildwheel, this command
turns build ids into its configuration, so the versions, arch lists, repair rules and pins still come
from build-matrix.yaml: the identifiers to build (CIBW_BUILD), TORCH_CUDA_ARCH_LIST and CUDA_HOME
(CIBW_ENVIRONMENT), the exact torch and the pinned build requirements (CIBW_BEFORE_BUILD, the build runs
without isolation against that torch), auditwheel with the libraries torch and the driver provide left
out (Linux) and delvewheel (Windows). One cibuildwheel run builds one (package, platform, torch, CUDA,
archs) combination, for one or more Pythons.

On Linux the build runs in the toolchain image of docker-bake.hcl (manylinux_2_28 + CUDA):
``docker buildx bake toolchain-cu128`` first. On Windows the CUDA toolkit must be installed on the host
(CUDA_PATH set).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from packaging.requirements import Requirement

from . import envs, tags
from .bake import toolchain_image
from .build import AUDITWHEEL_EXCLUDES, WINDOWS_PROVIDED_DLLS
from .errors import SagebuildError, UsageError
from .matrix import Matrix, Target, read_build_requires

VERSION_CONFIG = "sagebuild-version.cfg"  # sageattn3's local version, through DIST_EXTRA_CONFIG


def machine(target: Target) -> str:
    """cibuildwheel's arch of a build, from its wheel platform tag: linux_x86_64 -> x86_64,
    linux_aarch64 -> aarch64, win_amd64 -> AMD64, win_arm64 -> ARM64."""
    system, _, arch = target.wheel_platform.partition("_")
    if system == "linux" and arch:
        return arch
    if system == "win" and arch:
        return arch.upper()
    raise UsageError(
        f"{target.id}: no cibuildwheel arch for wheel platform {target.wheel_platform!r} "
        "(cibuildwheel configuration covers linux_* and win_* wheels)"
    )


def identifier(target: Target) -> str:
    """cibuildwheel's build identifier: ``cp312-manylinux_x86_64`` / ``cp312-win_amd64``."""
    arch = machine(target)
    if target.wheel_platform.startswith("linux_"):
        return f"{target.python_tag}-manylinux_{arch}"
    return f"{target.python_tag}-{target.wheel_platform}"


def _requirements_for(requirements: Sequence[str], python: str, system: str) -> list[str]:
    """Pinned requirements with their markers evaluated for the target Python (no markers left, so
    the commands need no quoting beyond plain words)."""
    environment = {
        "python_version": python,
        "python_full_version": python + ".0",
        "platform_system": system,
        "sys_platform": "win32" if system == "Windows" else "linux",
        "os_name": "nt" if system == "Windows" else "posix",
    }
    out = []
    for text in requirements:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(environment):
            continue
        req.marker = None
        out.append(str(req))
    return out


def _join(words: Sequence[str], windows: bool) -> str:
    if not windows:
        return " ".join(shlex.quote(w) for w in words)
    return " ".join(f'"{w}"' if any(c in w for c in ' &|<>^;"') else w for w in words)


def _pip_install(words: Sequence[str], windows: bool) -> str:
    return _join(["python", "-m", "pip", "install", *words], windows)


def config_for(matrix: Matrix, targets: Sequence[Target], index_url: str | None = None) -> dict:
    """The cibuildwheel options for targets that share package, platform, torch, CUDA and archs.

    Returns ``{"package_dir", "platform", "identifiers", "options"}``; options use cibuildwheel's TOML
    names.
    """
    if not targets:
        raise UsageError("give at least one --target")
    first = targets[0]
    key = (first.package, first.platform, first.torch, first.cuda, first.archs)
    for other in targets[1:]:
        if (other.package, other.platform, other.torch, other.cuda, other.archs) != key:
            raise UsageError(
                f"{first.id} and {other.id} differ in package, platform, torch, CUDA or archs: one "
                "cibuildwheel run builds one such combination (run it once per combination)"
            )
    ids = [identifier(t) for t in targets]
    if len(set(ids)) != len(ids):
        raise UsageError("two targets build the same Python")
    package = matrix.package(first.package)
    platform = matrix.platform(first.platform)
    windows = platform.system == "Windows"
    pyproject = matrix.root / package.source_dir / "pyproject.toml"
    if not pyproject.is_file():
        raise SagebuildError(f"{package.name}: {pyproject} does not exist (its sources are not here)")
    index = envs.torch_index(tags.cuda_tag(first.cuda), index_url)
    torch_cmd = _pip_install([f"torch=={first.torch}", *(["--index-url", index] if index else [])], windows)

    pins = read_build_requires(pyproject) + list(matrix.build_env)
    if windows:
        pins += list(matrix.tools.get(first.platform, ()))
    environment = {
        "SAGEATTENTION_BUILD_CUDA": "1",
        "TORCH_CUDA_ARCH_LIST": first.arch_list,
        "CUDA_HOME": "$CUDA_PATH" if windows else f"/usr/local/cuda-{first.cuda}",
    }
    if package.abi3 is not None:  # the wheel kind setup.py builds, as `sagebuild build` passes it
        environment["SAGEATTENTION_WHEEL"] = "abi3" if first.naming == "abi3" else "pinned"
    prefix = ""
    if first.local_version:
        # setuptools reads the local version from this file (sagebuild build does the same). The build
        # backend runs in the package folder, where a relative DIST_EXTRA_CONFIG is looked up, while
        # before-build runs in the project folder: the file goes to cibuildwheel's {package}, whose
        # path reaches Python as an argument (a Windows path inside a string literal would be read
        # for escapes).
        environment["DIST_EXTRA_CONFIG"] = VERSION_CONFIG
        text = f"[egg_info]\\ntag_build = +{first.local_version}\\n"
        write = f"import sys; open(sys.argv[1], 'w').write('{text}')"
        prefix = f'python -c "{write}" "{{package}}/{VERSION_CONFIG}" && '
    before_build = {  # identifier -> command; pins can differ per Python (markers)
        identifier(t): prefix
        + torch_cmd
        + " && "
        + _pip_install(_requirements_for(pins, t.python, platform.system), windows)
        for t in targets
    }
    commands = list(before_build.values())
    options: dict = {
        "build": " ".join(ids),
        "archs": [machine(first)],
        "build-frontend": {"name": "build", "args": ["--no-isolation"]},
        "before-build": commands[0],
        "environment": environment,
        "before-test": torch_cmd,
        "test-command": f'python -c "import torch, {package.name.replace("-", "_")}"',
        "build-verbosity": 1,
    }
    if windows:
        dlls = ";".join(WINDOWS_PROVIDED_DLLS)
        options["repair-wheel-command"] = f'delvewheel repair --no-dll "{dlls}" -w {{dest_dir}} {{wheel}}'
    else:
        excludes = " ".join(f"--exclude {shlex.quote(p)}" for p in AUDITWHEEL_EXCLUDES)
        options[f"manylinux-{machine(first)}-image"] = toolchain_image(matrix, first.platform, first.cuda)
        options["repair-wheel-command"] = (
            f"auditwheel repair --plat {platform.repair_platform} {excludes} -w {{dest_dir}} {{wheel}}"
        )
    if len(set(commands)) > 1:
        options["overrides"] = [{"select": i, "before-build": cmd} for i, cmd in before_build.items()]
    return {
        "package_dir": package.source_dir,
        "platform": platform.system.lower(),  # cibuildwheel's --platform: linux, windows
        "identifiers": ids,
        "options": options,
    }


# ----------------------------------------------------------------------------------------------------
# renderings


def _env_value(value) -> str:
    if isinstance(value, dict):  # CIBW_ENVIRONMENT: KEY="value" pairs
        return " ".join(f'{k}="{v}"' for k, v in value.items())
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return str(value)


def as_env(config: dict) -> dict[str, str]:
    """CIBW_* environment variables (cibuildwheel's overrides have no variable form)."""
    options = dict(config["options"])
    suffix = "_WINDOWS" if config["platform"] == "windows" else "_LINUX"
    out: dict[str, str] = {}
    overrides = options.pop("overrides", None)
    if overrides:
        raise UsageError(
            "these targets need different build requirements per Python: use --format toml "
            "(cibuildwheel overrides), or one --target per run"
        )
    frontend = options.pop("build-frontend")
    out["CIBW_BUILD"] = options.pop("build")
    out[f"CIBW_ARCHS{suffix}"] = _env_value(options.pop("archs"))
    out["CIBW_BUILD_FRONTEND"] = f"{frontend['name']}; args: {' '.join(frontend['args'])}"
    out["CIBW_BUILD_VERBOSITY"] = str(options.pop("build-verbosity"))
    for key in ("before-build", "before-test", "test-command"):
        out["CIBW_" + key.upper().replace("-", "_")] = options.pop(key)
    out[f"CIBW_ENVIRONMENT{suffix}"] = _env_value(options.pop("environment"))
    out[f"CIBW_REPAIR_WHEEL_COMMAND{suffix}"] = options.pop("repair-wheel-command")
    for key in [k for k in options if k.startswith("manylinux-") and k.endswith("-image")]:
        out["CIBW_" + key.upper().replace("-", "_")] = options.pop(key)
    if options:
        raise AssertionError(f"options without a variable form: {sorted(options)}")
    return out


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {value!r}")


def as_toml(config: dict, comment: str = "") -> str:
    """A file for ``cibuildwheel --config-file`` (a [tool.cibuildwheel] table)."""
    options = dict(config["options"])
    overrides = options.pop("overrides", [])
    lines = [f"# {line}" if line else "#" for line in comment.splitlines()]
    lines.append("[tool.cibuildwheel]")
    platform_keys = ("archs", "environment", "repair-wheel-command")
    for key, value in options.items():
        if key not in platform_keys:
            lines.append(f"{key} = {_toml_value(value)}")
    lines += ["", f"[tool.cibuildwheel.{config['platform']}]"]
    for key in platform_keys:
        lines.append(f"{key} = {_toml_value(options[key])}")
    for override in overrides:
        lines += ["", "[[tool.cibuildwheel.overrides]]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in override.items()]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------
# command line


def cmd_cibw(args: argparse.Namespace) -> int:
    matrix = Matrix.load(args.matrix)
    targets = [matrix.find_target(t) for t in args.target]
    config = config_for(matrix, targets, args.index_url)
    header = (
        f"cibuildwheel configuration generated by `python -m sagebuild cibw` for {', '.join(args.target)}.\n"
        f"Run: cibuildwheel --platform {config['platform']} --config-file FILE {config['package_dir']}"
    )
    if args.format == "toml":
        text = as_toml(config, header)
    elif args.format == "json":
        text = json.dumps(config, indent=2) + "\n"
    elif args.format == "github":  # lines for $GITHUB_ENV (values are single lines)
        text = "".join(f"{k}={v}\n" for k, v in as_env(config).items())
    else:
        body = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in as_env(config).items())
        text = "".join(f"# {line}\n" for line in header.splitlines()) + body
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8", newline="\n")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text, end="")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    cibw = sub.add_parser(
        "cibw",
        help="cibuildwheel configuration for build ids (an alternative to `build`)",
        description="Print or write cibuildwheel's configuration for one or more build ids that share "
        "package, platform, torch, CUDA and archs.",
    )
    cibw.add_argument("--target", action="append", required=True, help="a build id (repeatable)")
    cibw.add_argument(
        "--format",
        choices=["shell", "github", "toml", "json"],
        default="shell",
        help="shell: export lines; github: KEY=VALUE for $GITHUB_ENV; toml: a --config-file; json",
    )
    cibw.add_argument("--output", help="write to this file instead of stdout")
    cibw.add_argument(
        "--index-url", help="index for torch (default: $SAGEBUILD_TORCH_INDEX, then pip's configured one)"
    )
    cibw.set_defaults(func=cmd_cibw)
