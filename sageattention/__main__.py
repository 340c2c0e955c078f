"""``python -m sageattention env [--json]``: what is installed here and which backend sageattn picks.

Plain text by default (for bug reports), JSON with ``--json`` (for scripts). It never fails on a
machine without a GPU, Triton or the compiled extensions: it says why each one is missing.

``python -m sageattention run script.py [args...]`` (or ``run -m module [args...]``) runs a script as
``__main__`` with every ``F.scaled_dot_product_attention`` call through sageattn where it computes the
same (``sageattention.integrations.sdpa``), and prints where the calls went to stderr at exit.
``SAGEATTENTION_PATCH_SDPA=0`` runs it without the patch (the counts then say so).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import runpy
import sys

import torch

from . import __version__, _native, dispatch, extensions, ops


def _triton_info() -> dict:
    try:
        triton = importlib.import_module("triton")
    except ImportError as exc:
        return {"version": None, "reason": f"{type(exc).__name__}: {exc}"}
    return {"version": getattr(triton, "__version__", "unknown"), "reason": None}


def _extensions_info() -> dict:
    built_archs = extensions.build_info().get("extensions", {})
    modules = [(arch, name) for arch, name in extensions.COMPILED_EXTENSIONS.items()]
    modules.append(("quantization", extensions.FUSED_EXTENSION))
    info = {}
    for family, name in modules:
        module, reason = extensions._import_extension(name)
        info[name] = {
            "arch_family": family,
            "present": module is not None,
            "path": getattr(module, "path", None),
            "archs": built_archs.get(f"sageattention.{name}", []),
            "reason": reason,
        }
    return info


def _wheel_info() -> dict:
    """Which build is installed (its record), and whether it fits the installed torch."""
    record = extensions.build_info()
    problem = _native.cuda_line_problem(record)
    return {
        "kind": record.get("wheel_kind", "source tree" if not record else "per-torch"),
        "cuda_line": record.get("cuda_line"),
        "nvcc": record.get("nvcc"),
        "torch_floor": record.get("torch_floor"),
        "built_with_torch": record.get("torch"),
        "fits": problem is None,
        "problem": problem,
    }


def _devices() -> list:
    if not torch.cuda.is_available():
        return []
    devices = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        devices.append(
            {
                "index": index,
                "name": props.name,
                "capability": dispatch.sm((props.major, props.minor)),
                "memory_gib": round(props.total_memory / 2**30, 1),
                "sageattn": dispatch.explain(torch.device("cuda", index)),
            }
        )
    return devices


def collect() -> dict:
    """Everything the report shows, as plain data."""
    devices = _devices()
    return {
        "sageattention": {"version": __version__, "path": os.path.dirname(os.path.abspath(__file__))},
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": {
            "version": torch.__version__,
            "cuda": torch.version.cuda,
            "hip": torch.version.hip,
            "cuda_available": torch.cuda.is_available(),
            "arch_list": torch.cuda.get_arch_list() if torch.cuda.is_available() else [],
        },
        "triton": _triton_info(),
        "triton_kernels": {
            "importable": ops.triton_module() is not None,
            "reason": ops.triton_unavailable_reason(),
        },
        "wheel": _wheel_info(),
        "compiled_extensions": _extensions_info(),
        "devices": devices,
        # What sageattn does with bf16, head_dim 128 on the default device (the first GPU, else the CPU).
        "sageattn": devices[0]["sageattn"] if devices else dispatch.explain("cpu"),
    }


def _text(info: dict) -> str:
    t = info["torch"]
    lines = [
        f"sageattention     {info['sageattention']['version']} ({info['sageattention']['path']})",
        f"python            {info['python']}",
        f"platform          {info['platform']}",
        f"torch             {t['version']} (CUDA {t['cuda']}, HIP {t['hip']})",
        f"torch archs       {' '.join(t['arch_list']) or '-'}",
    ]
    wheel = info["wheel"]
    built = (
        f"CUDA {wheel['cuda_line']}.x line (nvcc {wheel['nvcc']})"
        if wheel["cuda_line"]
        else "no CUDA modules"
    )
    floor = f", torch >= {wheel['torch_floor']}" if wheel["torch_floor"] else ""
    fits = "fits the installed torch" if wheel["fits"] else f"DOES NOT FIT: {wheel['problem']}"
    lines.append(f"wheel             {wheel['kind']}, {built}{floor}; {fits}")
    tri = info["triton"]
    lines.append(f"triton            {tri['version'] or 'missing: ' + tri['reason']}")
    kern = info["triton_kernels"]
    lines.append(
        f"triton kernels    {'importable' if kern['importable'] else 'unavailable: ' + kern['reason']}"
    )
    for name, ext in info["compiled_extensions"].items():
        archs = f", SASS for {';'.join(ext['archs'])}" if ext["archs"] else ""
        state = f"present{archs} ({ext['path']})" if ext["present"] else f"missing: {ext['reason']}"
        lines.append(f"{name:<17} {ext['arch_family']} kernels, {state}")
    if not info["devices"]:
        lines.append("GPUs              none visible to torch")
    for dev in info["devices"]:
        lines.append(f"GPU {dev['index']:<13} {dev['name']}, {dev['capability']}, {dev['memory_gib']} GiB")
    choice = info["sageattn"]
    lines.append("")
    lines.append(
        f"sageattn on {choice['device']} ({choice['capability'] or 'no CUDA capability'}), "
        f"{choice['dtype']}, head_dim {choice['head_dim']}: {choice['backend']} - {choice['description']}"
    )
    for reason in choice["reasons"]:
        lines.append(f"  because: {reason}")
    lines.append("  dispatch table:")
    for row in choice["table"]:
        lines.append(f"    {row['row']:<45} {row['status']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sageattention", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    env = sub.add_parser("env", help="versions, GPUs, compiled kernels and the backend sageattn picks")
    env.add_argument("--json", action="store_true", help="print JSON instead of text")
    run = sub.add_parser(
        "run",
        help="run a Python script with F.scaled_dot_product_attention through sageattn where it can be",
        description="Run a script as __main__ with the SDPA patch of sageattention.integrations.sdpa "
        "installed, then print to stderr how many scaled_dot_product_attention calls went to sageattn "
        "and why the others went to the original function. SAGEATTENTION_PATCH_SDPA=0 runs the script "
        "without the patch.",
    )
    run.add_argument(
        "--no-warn", action="store_true", help="no SDPAFallbackWarning (the counts still say why)"
    )
    run.add_argument("-m", dest="module", help="run a module as python -m does, instead of a script")
    run.add_argument("script", nargs="?", help="the script (with -m: the first argument of the module)")
    run.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args(argv)
    if args.command == "env":
        info = collect()
        print(json.dumps(info, indent=2) if args.json else _text(info))
    elif args.command == "run":
        if args.module is None and args.script is None:
            run.error("give a script, or -m and a module")
        script_args = ([args.script] if args.module and args.script else []) + args.args
        return _run(args.script if args.module is None else None, args.module, script_args, not args.no_warn)
    return 0


def _run(script: str | None, module: str | None, script_args: list, warn: bool) -> int:
    """Run the script (or module) as __main__ under the SDPA patch; the exit status it ends with."""
    from .integrations import sdpa  # noqa: PLC0415

    patch = sdpa.install(warn=warn) if sdpa.env_setting(default=True) else None
    code = 0
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [script or module, *script_args]
    if script is not None:  # as `python script.py`: the script's folder first on the path
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        if script is not None:
            runpy.run_path(script, run_name="__main__")
        else:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        sys.stdout.flush()
        if patch is None:
            print(f"sageattention run: not patched ({sdpa.ENV_VAR}=0)", file=sys.stderr)
        else:
            print(f"sageattention run: {sdpa.format_calls(patch)}", file=sys.stderr)
            sdpa.uninstall()
    return code


if __name__ == "__main__":
    sys.exit(main())
