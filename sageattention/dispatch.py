"""Which implementation serves a call: a table, read top to bottom, first match wins.

Each row routes a family of GPUs to a backend, best first. A row is taken when its route matches
the request, its backend can run the request (device, head dim, mask, varlen) and the backend is
available here (kernels built or importable). The last row, torch SDPA, takes everything else and
warns once per distinct reason per process, saying why the quantized kernels were not used.

    sm90                      CUDA sm90 kernel (key-padding masks too), else Triton FP8 (other masks)
    sm89, sm100, sm120, sm121 CUDA sm89 kernel, else Triton FP8 (Triton's FP8 path also runs on sm120+)
    sm80, sm86, sm87          CUDA sm80 kernel, else Triton FP16
    other sm80+ GPUs          Triton FP16
    anything else             torch SDPA (CPU, MPS, ROCm, GPUs below sm80, head_dim > 128, no Triton)

`select` is what the API calls: it is marked as a constant for torch.compile (its arguments are
constants of the trace), so the decision, its capability query and its warning happen once at
trace time and leave nothing in the graph.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from . import extensions, ops
from ._checks import ANY_MASK, KEY_PADDING_MASK, MAX_HEAD_DIM, NO_MASK
from .quant import PVDtype

Capability = Optional[tuple]


@dataclass(frozen=True)
class Request:
    """What the choice of a backend depends on."""

    device_type: str
    capability: Capability  # (major, minor) of a CUDA GPU, None for any other device
    dtype: torch.dtype
    head_dim: int  # only its side of MAX_HEAD_DIM matters (the API passes 128 or 129)
    has_mask: int = NO_MASK  # _checks.mask_kind: NO_MASK, KEY_PADDING_MASK or ANY_MASK (True: ANY_MASK)
    varlen: bool = False
    return_lse: bool = False
    is_hip: bool = False

    def __post_init__(self) -> None:
        if self.has_mask is True or self.has_mask is False:  # a mask or none, of whatever kind
            object.__setattr__(self, "has_mask", ANY_MASK if self.has_mask else NO_MASK)


@dataclass(frozen=True)
class Backend:
    """One implementation: what it can run, whether it is here, and its entry points."""

    name: str
    description: str
    pv: PVDtype | None
    dense: Callable
    varlen: Callable | None
    unavailable: Callable[[], str | None]  # None when available, else why not
    min_capability: Capability = None  # None: runs on any device
    exact_capability: Capability = None  # kernels for one arch only (sm90's wgmma)
    masks: int = NO_MASK  # the masks it takes: none, key-padding masks (_checks.mask_kind) or any
    compiled: bool = False  # a compiled extension (its absence reads "not built")
    #: (q, k, v, *, nhd, is_causal, sm_scale, smooth_k, return_lse, key_mask) -> a function of (q, k, v)
    #: (and the mask, where key_mask is not None) that serves later calls of that signature, or None (see
    #: call_plan); None: the backend has none
    plan: Callable | None = None
    #: why the installed build holds no code for a GPU of this capability (None: it does)
    no_image: Callable[[tuple], str | None] = lambda capability: None

    def cannot_run(self, req: Request) -> str | None:
        """Why this backend cannot run the request (device, shape, options), or None."""
        if self.min_capability is None:
            return None
        if req.capability is None:
            return f"device {req.device_type} is not a CUDA GPU"
        if req.is_hip:
            return "ROCm GPUs are not supported by the quantized kernels"
        arch = sm(req.capability)
        if self.exact_capability is not None and req.capability != self.exact_capability:
            return f"needs {sm(self.exact_capability)}, this GPU is {arch}"
        if req.capability < self.min_capability:
            return f"needs {sm(self.min_capability)} or newer, this GPU is {arch}"
        if req.head_dim > MAX_HEAD_DIM:
            return f"head_dim > {MAX_HEAD_DIM}"
        if req.has_mask > self.masks:
            if self.masks == KEY_PADDING_MASK:
                return "attn_mask other than a key-padding mask (bool [B, 1, 1, Nk] without is_causal)"
            return "no attn_mask support"
        if req.varlen and self.varlen is None:
            return "no variable-length (packed) support"
        return None

    def why_not(self, req: Request) -> str | None:
        """cannot_run, then availability, then whether the build holds code for this GPU."""
        why = self.cannot_run(req) or self.unavailable()
        if why is None and req.capability is not None:
            why = self.no_image(req.capability)
        return why


@dataclass(frozen=True)
class Entry:
    """A row of the table: requests it routes, to which backend."""

    name: str
    route: Callable[[Request], bool]
    backend: Backend


def sm(capability: tuple) -> str:
    return f"sm{capability[0]}{capability[1]}"


def _archs(*capabilities: tuple) -> Callable[[Request], bool]:
    return lambda req: req.capability in capabilities


def _newer_than(capability: tuple) -> Callable[[Request], bool]:
    return lambda req: req.capability is not None and req.capability >= capability


def _always(req: Request) -> bool:
    return True


def _cuda(arch: str) -> Callable[[], str | None]:
    return lambda: extensions.cuda_unavailable_reason(arch)


def _cuda_image(arch: str) -> Callable[[tuple], str | None]:
    return lambda capability: extensions.cuda_image_missing_reason(arch, capability)


def _triton() -> str | None:
    return ops.triton_unavailable_reason()


def _here() -> str | None:
    return None


def _cuda_plan(arch: str) -> Callable:
    def plan(q, k, v, **kwargs):
        return ops.cuda_call_plan(q, k, v, arch=arch, **kwargs)

    return plan


def _cuda_dense(arch: str) -> Callable:
    """The dense entry point of an arch family's compiled kernels (ops.cuda_attention, looked up at
    call time)."""

    def dense(q, k, v, **kwargs):
        return ops.cuda_attention(q, k, v, arch=arch, **kwargs)

    dense.__name__ = dense.__qualname__ = f"cuda_{arch}_attention"
    return dense


CUDA_SM90 = Backend(
    "cuda_sm90", "CUDA sm90 kernel (INT8 QK, FP8 PV, wgmma)", PVDtype.FP8, _cuda_dense("sm90"), None,
    _cuda("sm90"), min_capability=(9, 0), exact_capability=(9, 0), masks=KEY_PADDING_MASK, compiled=True,
    no_image=_cuda_image("sm90"), plan=_cuda_plan("sm90"),
)  # fmt: skip
CUDA_SM89 = Backend(
    "cuda_sm89", "CUDA sm89 kernel (INT8 QK, FP8 PV, mma.sync)", PVDtype.FP8, _cuda_dense("sm89"), None,
    _cuda("sm89"), min_capability=(8, 9), compiled=True, no_image=_cuda_image("sm89"),
)  # fmt: skip
CUDA_SM80 = Backend(
    "cuda_sm80", "CUDA sm80 kernel (INT8 QK with two-level K, FP16 PV)", PVDtype.FP16, _cuda_dense("sm80"),
    None, _cuda("sm80"), min_capability=(8, 0), compiled=True, no_image=_cuda_image("sm80"),
)  # fmt: skip
TRITON_FP8 = Backend(
    "triton_fp8", "Triton (INT8 QK, FP8 PV)", PVDtype.FP8, ops.triton_attention, ops.triton_varlen,
    _triton, min_capability=(8, 9), masks=ANY_MASK,
)  # fmt: skip
TRITON_FP16 = Backend(
    "triton_fp16", "Triton (INT8 QK, FP16 PV)", PVDtype.FP16, ops.triton_attention, ops.triton_varlen,
    _triton, min_capability=(8, 0), masks=ANY_MASK,
)  # fmt: skip
SDPA = Backend(
    "sdpa", "torch scaled_dot_product_attention (not quantized)", None, ops.sdpa_attention, ops.sdpa_varlen,
    _here, masks=ANY_MASK,
)  # fmt: skip

BACKENDS = {b.name: b for b in (CUDA_SM90, CUDA_SM89, CUDA_SM80, TRITON_FP8, TRITON_FP16, SDPA)}

_FP8_FAMILY = ((8, 9), (10, 0), (12, 0), (12, 1))
_AMPERE = ((8, 0), (8, 6), (8, 7))

#: On sm90 the CUDA kernel leads the Triton FP8 kernels at every length (H100, b=4 h=32 d=128 bf16,
#: full call TOPS, CUDA against Triton, bench/results/attention-NVIDIA_H100_80GB_HBM3-2026-11-23b.json:
#: non-causal n=1024 303 / 155, 4096 639 / 543, 16384 793 / 556; causal 183 / 53, 483 / 436, 707 /
#: 600; b=1 h=24 n=4608 589 / 475). Triton serves what the CUDA kernel does not take (masks other than
#: key-padding masks).
TABLE = (
    Entry("sm90: CUDA sm90 kernel", _archs((9, 0)), CUDA_SM90),
    Entry("sm90: Triton FP8", _archs((9, 0)), TRITON_FP8),
    Entry("sm89/sm100/sm120/sm121: CUDA sm89 kernel", _archs(*_FP8_FAMILY), CUDA_SM89),
    Entry("sm89/sm100/sm120/sm121: Triton FP8", _archs(*_FP8_FAMILY), TRITON_FP8),
    Entry("sm80/sm86/sm87: CUDA sm80 kernel", _archs(*_AMPERE), CUDA_SM80),
    Entry("sm80 and newer: Triton FP16", _newer_than((8, 0)), TRITON_FP16),
    Entry("anything else: torch SDPA", _always, SDPA),
)


# --------------------------------------------------------------------------------------------------
# Device facts, cached (one query per device index per process)


def device_capability(device_type: str, index: int | None) -> Capability:
    """(major, minor) of a CUDA device, None for other devices."""
    if device_type != "cuda":
        return None
    return extensions.cuda_capability(torch.cuda.current_device() if index is None else index)


def make_request(
    device_type, index, dtype, head_dim, has_mask=False, varlen=False, return_lse=False
) -> Request:
    return Request(
        device_type, device_capability(device_type, index), dtype, head_dim, has_mask, varlen, return_lse,
        is_hip=device_type == "cuda" and torch.version.hip is not None,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Decisions


def decide(req: Request) -> tuple[Entry, list[str]]:
    """The first row that routes, can run and is available; with why earlier matching rows were not.

    The reasons are grouped: one line per distinct reason, naming the backends it stopped.
    """
    skipped: dict[str, list[str]] = {}
    for entry in TABLE:
        if not entry.route(req):
            continue
        why = entry.backend.why_not(req)
        if why is None:
            reasons = [f"{why} ({', '.join(names)})" for why, names in skipped.items()]
            if entry.backend is SDPA and not reasons:  # no row routed this device to a quantized backend
                reasons = [TRITON_FP16.cannot_run(req) or "no quantized backend routes this device"]
            return entry, reasons
        names = skipped.setdefault(why, [])
        if entry.backend.name not in names:
            names.append(entry.backend.name)
    raise AssertionError("the last row of TABLE takes every request")


class SageAttentionFallbackWarning(UserWarning):
    """sageattn is running through torch SDPA (not quantized) on this machine; the message says why."""


_decisions: dict = {}
_warned: set = set()


def _warn_once(reasons: list[str]) -> None:
    message = (
        "sageattention: using torch scaled_dot_product_attention (not quantized) because "
        + "; ".join(reasons)
        + ". Run `python -m sageattention env` for details."
    )
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, SageAttentionFallbackWarning, stacklevel=5)


def _forced(caller: str, req: Request, backend: Backend) -> str:
    """A named variant: its backend, or a RuntimeError saying why it cannot run here."""
    hint = "use sageattn() which picks an available backend"
    if backend.compiled:
        reason = backend.unavailable()
        if reason is not None:
            raise RuntimeError(f"{caller}() is not built in this installation (reason: {reason}); {hint}")
    why = backend.why_not(req)
    if why is not None:
        raise RuntimeError(f"{caller}() cannot run here ({backend.name}: {why}); {hint}")
    return backend.name


@torch.compiler.assume_constant_result
def select(
    device_type: str,
    index: int | None,
    dtype: torch.dtype,
    head_dim: int,
    has_mask: int,
    varlen: bool,
    return_lse: bool,
    forced: str | None = None,
    caller: str = "sageattn",
) -> str:
    """Name of the backend for a call (memoized). ``forced`` names the backend of an explicit variant."""
    key = (device_type, index, dtype, head_dim, has_mask, varlen, return_lse, forced, caller)
    name = _decisions.get(key)
    if name is None:
        req = make_request(device_type, index, dtype, head_dim, has_mask, varlen, return_lse)
        if forced is not None:
            name = _forced(caller, req, BACKENDS[forced])
        else:
            entry, reasons = decide(req)
            name = entry.backend.name
            if entry.backend is SDPA:
                _warn_once(reasons)
        _decisions[key] = name
    return name


# --------------------------------------------------------------------------------------------------
# Call plans: eager calls of a signature seen before skip the checks, the decision and the layers


#: Plans by call signature (core.call_key): a function of (q, k, v), and of the mask for a masked
#: signature, giving (out, lse), or False where the backend has none. Cleared when full.
_plans: dict = {}
_MAX_PLANS = 256


def call_plan(key):
    """The plan of a signature (a function of q, k, v), False (none), or None (not seen yet)."""
    return _plans.get(key)


def remember_plan(key, backend: Backend, q, k, v, key_mask=None, **args) -> None:
    """Make and keep the plan of the call just served by ``backend`` with these HND views (``args``:
    nhd, is_causal, sm_scale, smooth_k and return_lse, checked; ``key_mask``: the call's mask, checked,
    of a kind the backend takes, or None): False where the backend has none."""
    if len(_plans) >= _MAX_PLANS:
        _plans.clear()
    plan = backend.plan(q, k, v, key_mask=key_mask, **args) if backend.plan is not None else None
    _plans[key] = plan or False


def reset() -> None:
    """Forget cached decisions, plans, capabilities and warnings (for tests)."""
    _decisions.clear()
    _plans.clear()
    _warned.clear()
    extensions.cuda_capability.cache_clear()


# --------------------------------------------------------------------------------------------------
# Explanation, for `python -m sageattention env`


def explain(device=None, dtype: torch.dtype = torch.bfloat16, head_dim: int = 128) -> dict:
    """What ``sageattn`` picks on a device (default: the current GPU, else the CPU), and why."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    req = make_request(device.type, device.index, dtype, head_dim)
    entry, reasons = decide(req)
    rows = []
    for row in TABLE:
        if not row.route(req):
            status = "not routed here"
        elif row is entry:
            status = "chosen"
        elif TABLE.index(row) > TABLE.index(entry):
            status = "not reached"
        else:
            status = f"skipped: {row.backend.why_not(req)}"
        rows.append({"row": row.name, "backend": row.backend.name, "status": status})
    return {
        "device": str(device),
        "capability": sm(req.capability) if req.capability else None,
        "dtype": str(dtype).replace("torch.", ""),
        "head_dim": head_dim,
        "backend": entry.backend.name,
        "description": entry.backend.description,
        "reasons": reasons,
        "table": rows,
    }
