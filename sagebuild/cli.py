"""Command line: ``python -m sagebuild {plan,build,verify,diff,index,which,docs,validate,bake,cibw,...}``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import docs, envs
from .errors import SagebuildError, UsageError
from .matrix import REPO_ROOT, Matrix, Target

EXAMPLES = """\
examples:
  python -m sagebuild plan --profile stable --platform linux
  python -m sagebuild plan --profile sage2-all --format github
  python -m sagebuild build                                   # the wheel for this machine
  python -m sagebuild build --target linux-sageattention-pytorch28-cu129-python312
  python -m sagebuild build --torch 2.14.1 --cuda 13.0 --python 3.11 --archs 9.0a
  python -m sagebuild build --cpu                             # pure-Python wheel
  python -m sagebuild verify wheelhouse/*.whl
  python -m sagebuild diff first/X.whl second/X.whl          # two builds of one source: what differs
  python -m sagebuild index wheelhouse && python -m sagebuild which --index wheelhouse
"""


def _load(args: argparse.Namespace) -> Matrix:
    return Matrix.load(args.matrix)


# ----------------------------------------------------------------------------------------------------
# plan


def why_no_builds(matrix: Matrix, profile: str, platform: str | None, package: str | None) -> str:
    """Why ``profile`` narrowed by ``platform`` and ``package`` selects nothing, and what would select
    something."""
    spec = matrix.profiles[profile]
    set_package = matrix.sets[spec.set]["package"]
    if package is not None and package != set_package:
        others = [p for p in matrix.profiles if matrix.sets[matrix.profiles[p].set]["package"] == package]
        return (
            f"profile {profile} builds {set_package} (its set {spec.set} is for {set_package}), not "
            f"{package}; the profiles that build {package}: {', '.join(others) or '(none)'}"
        )
    if platform is not None and spec.platforms and platform not in spec.platforms:
        return (
            f"profile {profile} builds only for {', '.join(spec.platforms)} (its platforms: list), "
            f"not {platform}"
        )
    return f"the filters of profile {profile} leave no build of set {spec.set}"


def _check_platform(matrix: Matrix, platform: str | None) -> None:
    if platform is not None and platform not in matrix.platforms:
        raise UsageError(
            f"unknown platform {platform!r}; the matrix's platforms: {', '.join(matrix.platforms)}"
        )


def cmd_plan(args: argparse.Namespace) -> int:
    matrix = _load(args)
    if args.profile not in matrix.profiles:
        raise UsageError(f"unknown profile {args.profile!r}; valid profiles: {', '.join(matrix.profiles)}")
    _check_platform(matrix, args.platform)
    if args.system is not None and args.platform is not None:
        raise UsageError("give --platform or --system, not both")
    targets = matrix.profile_targets(args.profile, platform=args.platform, package=args.package)
    if args.system is not None:
        systems = {p.system for p in matrix.platforms.values()}
        if args.system not in systems:
            raise UsageError(
                f"unknown system {args.system!r}; the matrix's systems: {', '.join(sorted(systems))}"
            )
        targets = [t for t in targets if matrix.platforms[t.platform].system == args.system]
    if not targets and not args.allow_empty:
        where = args.platform or (f"{args.system} platforms" if args.system else None)
        reason = why_no_builds(matrix, args.profile, args.platform, args.package)
        if args.system and reason.startswith("the filters"):
            reason = f"profile {args.profile} has no builds for the {args.system} platforms"
        raise UsageError(
            f"profile {args.profile} selects no builds"
            + (f" for {args.package}" if args.package else "")
            + (f" on {where}" if where else "")
            + f": {reason} (--allow-empty prints an empty plan instead)"
        )
    runners = {name: p.runner for name, p in matrix.platforms.items()}
    if args.format == "github":
        print(
            json.dumps({"include": [t.to_dict(runners[t.platform]) for t in targets]}, separators=(",", ":"))
        )
        return 0
    if args.format == "json":
        payload = {
            "profile": args.profile,
            "description": matrix.profiles[args.profile].description,
            "count": len(targets),
            "targets": [t.to_dict(runners[t.platform]) for t in targets],
        }
        print(json.dumps(payload, indent=2))
        return 0
    profile = matrix.profiles[args.profile]
    per_platform: dict[str, int] = {}
    for t in targets:
        per_platform[t.platform] = per_platform.get(t.platform, 0) + 1
    counts = ", ".join(f"{n} {p}" for p, n in per_platform.items()) or "none"
    print(f"profile {args.profile}: {profile.description}")
    print(f"{len(targets)} builds ({counts})")
    width = max((len(t.id) for t in targets), default=0)
    for t in targets:
        print(
            f"  {t.id:<{width}}  torch {t.torch:<7} CUDA {t.cuda:<5} Python {t.python:<5} archs {t.arch_list}"
        )
        print(f"  {'':<{width}}  -> {t.wheel_name}")
        if t.dropped_archs:
            print(
                f"  {'':<{width}}     ({', '.join(t.dropped_archs)} left out: CUDA {t.cuda} cannot target it)"
            )
    return 0


# ----------------------------------------------------------------------------------------------------
# build


def _targets_for_build(args: argparse.Namespace, matrix: Matrix) -> list[Target | None]:
    from .build import auto_target  # noqa: PLC0415

    pure = args.cpu or os.environ.get("SAGEATTENTION_BUILD_CUDA", "").strip() == "0"
    explicit = [args.target, args.profile, args.torch or args.cuda or args.python]
    if sum(bool(x) for x in explicit) > 1:
        raise UsageError("give one of --target, --profile, or --torch/--cuda/--python")
    if pure:
        if any(explicit):
            raise UsageError(
                "--cpu (or SAGEATTENTION_BUILD_CUDA=0) builds the pure-Python wheel: drop the target"
            )
        return [None]
    if args.target:
        target = matrix.find_target(args.target)
        if args.archs:
            target = matrix.make_target(
                target.package, target.platform, target.torch, target.cuda, target.python, args.archs,
                target.naming,
            )  # fmt: skip
        return [target]
    if args.profile:
        platform = envs.current_platform(matrix.wheel_platforms())
        targets = matrix.profile_targets(args.profile, platform=platform, package=args.package)
        if not targets:
            raise UsageError(
                f"profile {args.profile} has no {args.package} builds for {platform}: "
                + why_no_builds(matrix, args.profile, platform, args.package)
            )
        return list(targets)
    cuda_home = Path(args.cuda_home) if args.cuda_home else None
    target = auto_target(
        matrix,
        args.package,
        cuda_home,
        args.python_exe,
        args.archs,
        torch=args.torch,
        cuda=args.cuda,
        python=args.python,
        wheel=args.wheel,
    )
    if target is None:
        print(
            "no nvcc found on this machine: building the pure-Python wheel (use --torch/--cuda/--python "
            "or --target to build a CUDA wheel with a toolkit from pip packages)",
            flush=True,
        )
    return [target]


def cmd_build(args: argparse.Namespace) -> int:
    from .build import BuildOptions, build, cache_dir, check_torch_source  # noqa: PLC0415

    matrix = _load(args)
    targets = _targets_for_build(args, matrix)
    every = []
    for target in targets:
        every.append(
            BuildOptions(
                package=args.package,
                target=target,
                index_url=args.index_url,
                cuda_home=Path(args.cuda_home) if args.cuda_home else None,
                toolkit=args.toolkit,
                python_exe=args.python_exe,
                out=Path(args.out),
                use_current_env=args.use_current_env,
                fresh_env=args.fresh_env,
                repair=args.repair,
                verify=not args.no_verify,
                smoke=not args.no_smoke,
                allow_missing_cuobjdump=args.allow_missing_cuobjdump,
                cache=Path(args.cache_dir).resolve() if args.cache_dir else cache_dir(),
            )
        )
    for options in every:  # every build of a profile, before the first installs anything
        if options.target is not None and options.target.platform == envs.current_platform(
            matrix.wheel_platforms()
        ):
            check_torch_source(matrix, options.target, options)
    built = [build(matrix, options) for options in every]
    if len(built) > 1:
        print(f"built {len(built)} wheels:")
        for path in built:
            print(f"  {path}")
    return 0


# ----------------------------------------------------------------------------------------------------
# verify / index / which / docs


def cmd_verify(args: argparse.Namespace) -> int:
    from .build import cache_dir  # noqa: PLC0415
    from .matrix import parse_arch_list  # noqa: PLC0415
    from .verify import VerifyOptions, verify_paths  # noqa: PLC0415

    matrix = _load(args)
    options = VerifyOptions(
        expect_archs=parse_arch_list(args.expect_archs) if args.expect_archs else None,
        smoke=not args.no_smoke,
        smoke_python=args.smoke_python,
        find_links=list(args.find_links or []),
        index_url=args.index_url,
        torch_site=args.smoke_torch_site,
        cuobjdump=args.cuobjdump,
        allow_missing_cuobjdump=args.allow_missing_cuobjdump,
        fetch_cuobjdump=args.fetch_cuobjdump,
        cache_dir=cache_dir(),
    )
    reports = verify_paths([Path(p) for p in args.wheels], matrix, options)
    failed = [r.wheel for r in reports if not r.passed]
    if len(reports) > 1:
        print(f"{len(reports) - len(failed)} of {len(reports)} wheels passed")
    return 1 if failed else 0


def cmd_diff(args: argparse.Namespace) -> int:
    from .verify import compare_wheels  # noqa: PLC0415

    diff = compare_wheels(Path(args.a), Path(args.b))
    print(diff.render())
    if diff.identical_bytes:
        return 0
    return 1 if diff.unexpected or (args.strict and diff.differences) else 0


def cmd_index(args: argparse.Namespace) -> int:
    from .index import build_index  # noqa: PLC0415

    matrix = _load(args)
    out = Path(args.out) if args.out else Path(args.dir)
    manifest = build_index(Path(args.dir), out, matrix, copy=args.copy)
    simple = (out / "simple").resolve()
    print(f"{simple}: {len(manifest['simple'])} wheels")
    for variant, files in manifest["variants"].items():
        print(f"{(out / variant / 'simple').resolve()}: {len(files)} wheels")
    print(f"install with: pip install --index-url {envs.file_uri(simple)} <project>")
    print("(per-PyTorch indexes above; `python -m sagebuild which --index DIR` names yours)")
    return 0


def cmd_which(args: argparse.Namespace) -> int:
    from .index import EnvInfo, current_env, which  # noqa: PLC0415

    matrix = _load(args)
    _check_platform(matrix, args.platform)
    env = current_env(matrix)
    if args.torch or args.cuda or args.python or args.platform:
        env = EnvInfo(
            python=args.python or env.python,
            platform=args.platform or env.platform,
            torch=args.torch or env.torch,
            torch_cuda=args.cuda if args.cuda else env.torch_cuda,
        )
    code, lines = which(matrix, env, args.package, Path(args.index) if args.index else None)
    print("\n".join(lines))
    return code


def cmd_docs(args: argparse.Namespace) -> int:
    matrix = _load(args)
    text = docs.render(matrix)
    path = Path(args.output) if args.output else matrix.root / docs.OUTPUT
    return docs.write_generated(path, text, args.check, "python -m sagebuild docs")


def cmd_validate(args: argparse.Namespace) -> int:
    matrix = _load(args)
    builds = sum(len(matrix.profile_targets(p)) for p in matrix.profiles)
    print(
        f"{args.matrix}: valid ({len(matrix.torch)} PyTorch releases, {len(matrix.cuda)} CUDA versions, "
        f"{len(matrix.profiles)} profiles, {builds} profile builds)"
    )
    return 0


# ----------------------------------------------------------------------------------------------------


DEFAULT_MATRIX = REPO_ROOT / "build-matrix.yaml"
#: Exit status after stdout was closed by its reader (``plan | head``): what a shell reports for a
#: process ended by SIGPIPE (128 + 13).
BROKEN_PIPE_EXIT = 141


def _help_lists(matrix_path: str | Path) -> dict[str, str]:
    """Help fragments listing the matrix's profiles and platforms (the matrix given by --matrix)."""
    try:
        matrix = Matrix.load(matrix_path)
    except SagebuildError:
        return {"profiles": "see the matrix's profiles: section", "platforms": "see its platforms: section"}
    profiles = ", ".join(matrix.profiles)
    platforms = ", ".join(f"{n} ({p.wheel_platform})" for n, p in matrix.platforms.items())
    return {"profiles": profiles, "platforms": platforms}


def make_parser(matrix_path: str | Path | None = None) -> argparse.ArgumentParser:
    lists = _help_lists(matrix_path or DEFAULT_MATRIX)
    parser = argparse.ArgumentParser(
        prog="python -m sagebuild",
        description="Build, name, verify and index SageAttention wheels from build-matrix.yaml.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--matrix", default=str(DEFAULT_MATRIX), help="matrix file (default: %(default)s)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    plan = sub.add_parser(
        "plan",
        help="list the builds of a profile",
        description="List the builds (build ids, versions, archs, wheel names) of a profile of the "
        "matrix. A plan that selects nothing is an error that says why, unless --allow-empty.",
    )
    plan.add_argument("--profile", required=True, help=f"the profile: {lists['profiles']}")
    plan.add_argument(
        "--package", choices=["sageattention", "sageattn3"], help="only the builds of this package"
    )
    plan.add_argument("--platform", help=f"only the builds of this platform: {lists['platforms']}")
    plan.add_argument(
        "--system",
        help="only the builds of the platforms of this system (Linux, Windows): what one CI workflow builds",
    )
    plan.add_argument(
        "--format",
        choices=["text", "json", "github"],
        default="text",
        help='text (default); json; github: one line {"include": [...]} for a job matrix',
    )
    plan.add_argument(
        "--allow-empty",
        action="store_true",
        help="print an empty plan (exit 0) where the filters select no build (CI: a platform the profile "
        "does not build)",
    )
    plan.set_defaults(func=cmd_plan)

    build = sub.add_parser(
        "build",
        help="build (and verify) one wheel",
        description="Build a wheel in a clean environment and verify it. Without a target: the wheel for "
        "this machine (its Python, its nvcc's CUDA, the newest PyTorch shipping that CUDA), or the "
        "pure-Python wheel when there is no nvcc.",
    )
    build.add_argument("--target", help="a build id from `plan`")
    build.add_argument("--profile", help="build every target of a profile for this platform")
    build.add_argument("--torch", help="PyTorch version, e.g. 2.8.0")
    build.add_argument("--cuda", help="CUDA version, e.g. 12.9")
    build.add_argument("--python", help="Python version, e.g. 3.12")
    build.add_argument(
        "--package",
        default="sageattention",
        choices=["sageattention", "sageattn3"],
        help="the package to build (default: %(default)s)",
    )
    build.add_argument("--archs", help='arch list, e.g. "9.0a" or "8.9;9.0a" (default: the package defaults)')
    build.add_argument(
        "--wheel",
        choices=["abi3", "pinned"],
        help="without --target/--profile: abi3 (one wheel for every torch; the default without --torch) or "
        "pinned (torch==X and the {torch}.{cuda} build tag; the default with --torch)",
    )
    build.add_argument(
        "--cpu", action="store_true", help="pure-Python wheel (also SAGEATTENTION_BUILD_CUDA=0)"
    )
    build.add_argument(
        "--index-url", help="index to install torch from (default: $SAGEBUILD_TORCH_INDEX, then pip's)"
    )
    build.add_argument("--cuda-home", help="use this CUDA toolkit instead of the machine's or pip packages")
    build.add_argument(
        "--toolkit",
        choices=["auto", "local", "pip"],
        default="auto",
        help="CUDA toolkit: the machine's when its nvcc matches, else pip packages (auto); "
        "only the machine's (local); always pip packages (pip)",
    )
    build.add_argument("--python-exe", help="interpreter for the target Python (default: found on PATH)")
    build.add_argument(
        "--out", default=str(REPO_ROOT / "wheelhouse"), help="where the wheel goes (default: %(default)s)"
    )
    build.add_argument(
        "--cache-dir",
        help="environments, toolkits, work folders (default: $SAGEBUILD_CACHE_DIR or .sagebuild)",
    )
    build.add_argument(
        "--use-current-env",
        "--no-isolation-env",
        action="store_true",
        help="build in the running environment instead of a clean venv",
    )
    build.add_argument("--fresh-env", action="store_true", help="recreate the cached build environment")
    repair = build.add_mutually_exclusive_group()
    repair.add_argument(
        "--repair",
        dest="repair",
        action="store_const",
        const="yes",
        help="require auditwheel repair (Linux) / delvewheel check (Windows), installing the tool",
    )
    repair.add_argument(
        "--no-repair",
        dest="repair",
        action="store_const",
        const="no",
        help="keep the wheel as built: no auditwheel repair / delvewheel check (default: repair when "
        "the tool is at hand)",
    )
    build.set_defaults(repair="auto")
    build.add_argument(
        "--no-verify",
        action="store_true",
        help="copy the wheel out without `sagebuild verify` (name, metadata, RECORD, SASS, install test)",
    )
    build.add_argument("--no-smoke", action="store_true", help="verify without the install + import test")
    build.add_argument(
        "--allow-missing-cuobjdump",
        action="store_true",
        help="verify without the SASS check when no cuobjdump can be found or installed",
    )
    build.set_defaults(func=cmd_build)

    verify = sub.add_parser(
        "verify",
        help="check wheels: name, metadata, RECORD, SASS, install",
        description="Check each wheel: its name decodes to a build of the matrix, METADATA pins that "
        "torch, RECORD hashes match, the compiled modules hold SASS for the expected archs, and (unless "
        "--no-smoke) it installs and imports in a fresh venv. Exit 1 when any wheel fails.",
    )
    verify.add_argument("wheels", nargs="+", metavar="WHEEL", help="the wheel files to check")
    verify.add_argument("--expect-archs", help='archs the wheel must hold, e.g. "8.9;9.0a"')
    verify.add_argument("--no-smoke", action="store_true", help="skip the install + import test")
    verify.add_argument(
        "--smoke-python", help="interpreter for the smoke venv (default: one matching the wheel)"
    )
    verify.add_argument(
        "--find-links", action="append", help="where the smoke install finds torch (repeatable)"
    )
    verify.add_argument("--index-url", help="index for the smoke install")
    verify.add_argument("--smoke-torch-site", help="reuse the torch installed in this site-packages")
    verify.add_argument("--cuobjdump", help="path to cuobjdump")
    verify.add_argument(
        "--fetch-cuobjdump", action="store_true", help="install nvidia-cuda-cuobjdump when none is found"
    )
    verify.add_argument(
        "--allow-missing-cuobjdump", action="store_true", help="skip the SASS check without cuobjdump"
    )
    verify.set_defaults(func=cmd_verify)

    diff = sub.add_parser(
        "diff",
        help="compare two builds of one wheel: which members differ",
        description="Compare two wheels member by member (contents, time stamp, mode). Exit 0 when they "
        "are byte-identical or differ only in compiled objects (and the RECORD lines hashing them), "
        "which two builds of the same source may show; 1 otherwise.",
    )
    diff.add_argument("a", metavar="WHEEL_A", help="the first build")
    diff.add_argument("b", metavar="WHEEL_B", help="the second build of the same source")
    diff.add_argument(
        "--strict", action="store_true", help="exit 1 on any difference, compiled objects included"
    )
    diff.set_defaults(func=cmd_diff)

    index = sub.add_parser(
        "index",
        help="write a PEP 503 simple index for a folder of wheels",
        description="Index the .whl files of DIR: a flat simple/ index and one per PyTorch build. Every "
        ".whl file must be a wheel (a non-empty zip archive with a valid wheel name and .dist-info "
        "metadata): otherwise nothing is written and each bad file is named.",
    )
    index.add_argument("dir", help="the folder of wheels")
    index.add_argument("--out", help="where the index goes (default: DIR)")
    index.add_argument("--copy", action="store_true", help="copy the wheels into OUT/files")
    index.set_defaults(func=cmd_index)

    which = sub.add_parser(
        "which",
        help="name the wheel that fits this environment",
        description="Name the wheel (and its build id) that fits the running environment's Python, "
        "platform and torch, or the one given by --torch/--cuda/--python/--platform, and how to "
        "install or build it: the abi3 wheel of torch's CUDA line (12 or 13) where one fits (torch and "
        "Python at or above its floors), else the per-torch wheel. The default line's abi3 wheel "
        "installs from the package index; another line's from the cuNN/simple path of an index made by "
        "`index` (--index names it). With --index, exit 0 only when the wheel is in that index.",
    )
    which.add_argument("--index", help="an index made by `index`: exit 1 when the wheel is not in it")
    which.add_argument(
        "--package",
        default="sageattention",
        choices=["sageattention", "sageattn3"],
        help="the package (default: %(default)s)",
    )
    which.add_argument("--torch", help="pretend this torch version")
    which.add_argument("--cuda", help="pretend this torch CUDA version")
    which.add_argument("--python", help="pretend this Python version")
    which.add_argument("--platform", help=f"pretend this platform: {lists['platforms']}")
    which.set_defaults(func=cmd_which)

    doc = sub.add_parser(
        "docs",
        help="render BUILD_MATRIX.md from the matrix",
        description="Write BUILD_MATRIX.md (platforms, CUDA and PyTorch releases, packages, profiles with "
        "their builds) from the matrix; --check only compares.",
    )
    doc.add_argument("--check", action="store_true", help="exit 1 when the file is out of date")
    doc.add_argument("--output", help="file to write (default: BUILD_MATRIX.md next to the matrix)")
    doc.set_defaults(func=cmd_docs)

    validate = sub.add_parser(
        "validate",
        help="check build-matrix.yaml",
        description="Load the matrix and check every rule: versions, arch lists, sets, profiles, build "
        "ids and tags that decode. Exit 0 with a one-line summary, else 2 with each problem.",
    )
    validate.set_defaults(func=cmd_validate)

    # CI and packaging frontends (docs/ci.md): bake, cibw, release-check, ci-profiles, ci-env
    from . import bake, ci, cibw, release  # noqa: PLC0415

    for module in (bake, cibw, release, ci):
        module.register(sub)
    return parser


def _silence_stdout() -> None:
    """Point stdout at the null device, so that the flush at interpreter exit cannot fail again."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--matrix", default=str(DEFAULT_MATRIX))
    known, _ = pre.parse_known_args(argv)
    command = ""
    try:
        parser = make_parser(known.matrix)
        args = parser.parse_args(argv)
        command = args.command
        code = args.func(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at interpreter exit
        return code
    except SystemExit:  # --help and argparse's usage errors
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _silence_stdout()
            return BROKEN_PIPE_EXIT
        raise
    except BrokenPipeError:
        # `plan ... | head`: the reader has what it wanted; stop quietly
        _silence_stdout()
        return BROKEN_PIPE_EXIT
    except SagebuildError as exc:
        print(
            f"sagebuild {command}: error: {exc}" if command else f"sagebuild: error: {exc}", file=sys.stderr
        )
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
