"""The bottom layer: what is built and loadable here, and the facts of the GPU.

* the compiled modules (``sageattention._fused``, ``_qattn_sm80/_sm89/_sm90``), loaded through
  ``_native`` with their ops defined by ``cuda_ops``, and why one is not there;
* the wheel's record of the archs each one holds code for (``_build_info.json``), and whether that
  code runs on a given GPU;
* each GPU's compute capability, asked once.

It imports nothing of sageattention above ``_native`` and ``cuda_ops``: the launchers (cuda_common,
cuda_sm80/sm89/sm90), the Triton kernels and the backends (ops) build on it, dispatch on them, the API
(core) on top; tests/unit/test_layers.py keeps the import graph one-way.
"""

from __future__ import annotations

import functools
import re

import torch

from . import _native, cuda_ops

#: The compiled extensions, by the arch family their kernels were written for.
COMPILED_EXTENSIONS = {"sm80": "_qattn_sm80", "sm89": "_qattn_sm89", "sm90": "_qattn_sm90"}
#: The compiled fused quantization ops (torch.ops.sageattention.quant_*), for every built arch.
FUSED_EXTENSION = "_fused"


def _import_extension(module: str) -> tuple[_native.Library | None, str | None]:
    """(the module's functions, None) when ``sageattention.<module>`` loads and its ops are defined, else
    (None, why not); once (cuda_ops.register)."""
    if cuda_ops.register(module):
        return _native.load(module)[0], None
    return None, cuda_ops.unavailable_reason(module)


def extension_status(arch: str) -> tuple[_native.Library | None, str | None]:
    """(module, None) when ``sageattention._qattn_<arch>`` loads, else (None, why not)."""
    return _import_extension(COMPILED_EXTENSIONS[arch])


def build_info() -> dict:
    """What the build compiled, for which archs (``_native.build_info``, the wheel's
    ``_build_info.json``)."""
    return _native.build_info()


@functools.cache  # a handful of (arch, GPU) pairs; asked on every quantization_backend="cuda" call
def sass_runs_on(arch: str, capability: tuple) -> bool:
    """Whether SASS built for ``arch`` ("8.6", "9.0a", "10.0f") loads on a GPU of compute capability
    ``capability``: one of the same major and at least its minor; an arch-specific build ("a") only
    on that very arch. (The builds embed SASS alone, no PTX.) An arch of another form counts as
    runnable: the driver decides."""
    match = re.fullmatch(r"(\d+)\.(\d+)([af]?)", arch)
    if match is None:
        return True
    major, minor = int(match[1]), int(match[2])
    if match[3] == "a":
        return tuple(capability) == (major, minor)
    return capability[0] == major and capability[1] >= minor


@functools.cache
def cuda_capability(index: int) -> tuple[int, int]:
    """(major, minor) of CUDA device ``index``, queried once per process (the query costs about a
    microsecond, on every call that asked it); ``cuda_capability.cache_clear()`` forgets it."""
    return tuple(torch.cuda.get_device_capability(index))


def kernel_image_missing_reason(module: str, capability: tuple) -> str | None:
    """Why ``sageattention.<module>`` holds no code for a GPU of ``capability`` (None: it holds some,
    or the build left no record of its archs)."""
    archs = build_info().get("extensions", {}).get(f"sageattention.{module}")
    if not archs or any(sass_runs_on(arch, capability) for arch in archs):
        return None
    gpu = f"{capability[0]}.{capability[1]}"
    wanted = gpu + ("a" if capability[0] >= 9 else "")  # the builds name sm90 and newer arch-specific
    return (
        f"sageattention.{module} holds no code for this GPU ({gpu}; built for {', '.join(archs)}); a build "
        f"with {wanted} in TORCH_CUDA_ARCH_LIST has it"
    )


def cuda_image_missing_reason(arch: str, capability: tuple) -> str | None:
    """Why an arch family's kernels, or the fused quantization ops they read, hold no code for a GPU
    of ``capability`` (None: both do, as far as the build's record tells)."""
    return kernel_image_missing_reason(COMPILED_EXTENSIONS[arch], capability) or kernel_image_missing_reason(
        FUSED_EXTENSION, capability
    )


def fused_quant_unavailable_reason() -> str | None:
    """None when the compiled fused quantization ops (``sageattention._fused``) load, else why not."""
    module, reason = _import_extension(FUSED_EXTENSION)
    return None if module is not None else f"sageattention.{FUSED_EXTENSION} could not be imported ({reason})"


#: Arch families whose compiled kernels serve ``sageattn`` (and the named CUDA variants) in this version.
WIRED_EXTENSIONS = ("sm80", "sm89", "sm90")


def cuda_unavailable_reason(arch: str) -> str | None:
    """Why the compiled kernels of an arch family cannot serve ``sageattn`` here (None: they can)."""
    module, reason = extension_status(arch)
    if module is None:
        return f"sageattention.{COMPILED_EXTENSIONS[arch]} could not be imported ({reason})"
    if arch not in WIRED_EXTENSIONS:
        return f"sageattention.{COMPILED_EXTENSIONS[arch]} is present but not wired to the Python API yet"
    return fused_quant_unavailable_reason()  # the kernels read what the fused quantization ops write
