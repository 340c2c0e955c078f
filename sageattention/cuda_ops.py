"""The torch ops of the compiled modules: schemas, CUDA implementations and fake implementations.

The compiled modules export plain C functions (csrc/bindings.cpp, loaded by ``_native``); this
module defines the ``sageattention::*`` ops around them with ``torch.library``, so that one wheel
serves every PyTorch. Each op is one function below that allocates the op's outputs from its
inputs' shapes and, given the module's functions, launches; without them (``launch=None``) it is
the op's fake implementation, the same shapes without a launch, which torch.compile traces. Eager
callers (the launchers in cuda_sm80/sm89/sm90 and the Triton path) go through ``call``, which runs
the function directly: a round trip through the dispatcher into Python costs microseconds that show
at short sequence lengths. Under torch.compile ``call`` emits the op.

An op is defined when its module loads (``register(module)``); the reason a module did not load is
kept. Ops:

* ``quant_q_per_token``, ``quant_k_per_block``, ``quant_v_fp8``, ``quant_qkv_sm90``
  (``sageattention._fused``): the fused quantization. ``quant_k_per_block`` returns a list: [k_int8,
  k_scale], plus K's second INT8 digit with ``residual=True``. ``quant_qkv_sm90`` quantizes Q, K and V
  for the sm_90a kernel in one launch (two for long sequences) and returns (q_int8, q_scale, corr,
  k_int8, k_scale, vt, v_scale, k_mean).
* ``qk_int8_sv_f16_attn`` (``_qattn_sm80``): INT8 Q·Kᵀ (optionally two-level K), FP16 P·V. Returns
  ``out`` [B, Hq, Nq, D] of ``out_dtype`` (D = ``v.shape[-1]``), whose memory is [B, Nq, Hq, D] when
  ``out_nhd``, and the float32 LSE [B, Hq, Nq] (an empty tensor without ``return_lse``).
* ``qk_int8_sv_f8_attn_sm89`` (``_qattn_sm89``): INT8 Q·Kᵀ, FP8 P·V with mma.sync (sm89 and newer).
  Returns as the sm90 op below.
* ``qk_int8_sv_f8_attn_sm90`` (``_qattn_sm90``): INT8 Q·Kᵀ, FP8 P·V on sm_90a. Returns ``out``
  [B, Hq, Nq, D] of ``out_dtype`` (D = ``v_scale.shape[-1]``), whose memory is [B, Nq, Hq, D] when
  ``out_nhd``, and the float32 LSE [B, Hq, Nq] (an empty tensor without ``return_lse``).
* ``attn_sm90`` (``_qattn_sm90``): the whole sm_90a call from Q, K and V (``quant_qkv_sm90``, then
  ``qk_int8_sv_f8_attn_sm90``). Returns as that op, ``out`` of q's dtype and head dim.
* ``sm90_split_plan`` (``_qattn_sm90``): the split of the last wave's tiles (host arithmetic only).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import _native

__all__ = ["OPS", "call", "fp16_accum_built", "register", "registered", "unavailable_reason"]

FUSED, SM80, SM89, SM90 = "_fused", "_qattn_sm80", "_qattn_sm89", "_qattn_sm90"

_F32, _I8 = torch.float32, torch.int8
#: sage::PvAccum codes (csrc/include/sage_attn_mma.h) of each kernel's pv_accum strings.
_SM80_ACCUM = {"fp32": 0, "fp16+fp32": 1}
_SM89_ACCUM = {"fp32": 0, "fp32+fp32": 2, "fp32+fp16": 1}
#: Keys per K scale of the sm_90a kernel and its Vᵀ key padding (csrc/sm90/attn.h).
_SM90_KEY_BLOCK, _KEY_GROUP = 128, 16


@dataclass(frozen=True)
class OpSpec:
    """One op: its module, schema, and the function that allocates its outputs and launches
    (``body(launch, *args)``; ``launch`` None: the fake implementation). ``lse_output``: the body gives
    None for an LSE not asked for, which the op returns as an empty tensor."""

    name: str
    module: str
    schema: str
    body: Callable
    lse_output: bool = False


OPS: dict[str, OpSpec] = {}


def _op(module: str, schema: str, lse_output: bool = False):
    def define(body: Callable) -> Callable:
        OPS[body.__name__] = OpSpec(body.__name__, module, schema, body, lse_output)
        return body

    return define


def _need_dims(op: str, **tensors) -> None:
    """The dims the output shapes are read from (every other check is the C side's)."""
    for name, (x, dims) in tensors.items():
        if not isinstance(x, torch.Tensor) or x.dim() != dims:
            got = f"{x.dim()} dimensions" if isinstance(x, torch.Tensor) else type(x).__name__
            raise RuntimeError(f"sageattention::{op}: {name} must be a {dims}-d tensor, got {got}")


def _attn_outputs(like, b, hq, nq, d, out_dtype, out_nhd, return_lse):
    # new_empty_strided: a third of the host time of new_empty (and of a transposed one for NHD memory).
    if out_dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError(f"sageattention: out_dtype must be float16 or bfloat16, got {out_dtype}")
    strides = (nq * hq * d, d, hq * d, 1) if out_nhd else (hq * nq * d, nq * d, d, 1)
    out = like.new_empty_strided((b, hq, nq, d), strides, dtype=out_dtype)
    return out, (like.new_empty_strided((b, hq, nq), (hq * nq, nq, 1), dtype=_F32) if return_lse else None)


def _scratch(like, size: int):
    """A uint8 workspace of ``size`` bytes on like's device."""
    return like.new_empty_strided((size,), (1,), dtype=torch.uint8)


def _accum(op: str, table: dict, pv_accum: str) -> int:
    if pv_accum not in table:
        names = [repr(v) for v in table]
        valid = ", ".join(names[:-1]) + " or " + names[-1]
        raise RuntimeError(f"sageattention::{op}: pv_accum must be {valid}, got {pv_accum!r}")
    return table[pv_accum]


_sizes: dict[tuple, int] = {}  # workspace bytes by (function, sizes, device): one C call per shape


def _workspace(launch, symbol: str, *sizes: int) -> int:
    key = (launch.name, symbol, *sizes)
    size = _sizes.get(key)
    if size is None:
        fn = launch.function(symbol, ctypes.c_int64, [ctypes.c_int64] * len(sizes))
        size = int(fn(*sizes))
        if size < 0:
            raise RuntimeError(f"sageattention: {symbol}: {launch.last_error()}")
        _sizes[key] = size
    return size


# --------------------------------------------------------------------------------------------------
# sageattention._fused


@_op(FUSED, "(Tensor q, Tensor? k_mean, float sm_scale, float scale_mul, int d_pad, int kv_group, "
     "bool with_corr) -> (Tensor, Tensor, Tensor)")  # fmt: skip
def quant_q_per_token(launch, q, k_mean, sm_scale, scale_mul, d_pad, kv_group, with_corr):
    _need_dims("quant_q_per_token", q=(q, 4))
    b, h, n, _ = q.shape
    q_int8 = q.new_empty((b, h, n, d_pad), dtype=_I8)
    q_scale = q.new_empty((b, h, n), dtype=_F32)
    corr = q.new_empty((b if with_corr else 0, h, n), dtype=_F32)
    if launch is not None:
        launch.call("quant_q_per_token", (q, k_mean, q_int8, q_scale, corr), (d_pad, kv_group, with_corr),
                    (sm_scale, scale_mul))  # fmt: skip
    return q_int8, q_scale, corr


@_op(FUSED, "(Tensor k, Tensor? k_mean, int block, int d_pad, bool residual=False) -> Tensor[]")
def quant_k_per_block(launch, k, k_mean, block, d_pad, residual=False):
    _need_dims("quant_k_per_block", k=(k, 4))
    b, h, n, _ = k.shape
    k_int8 = k.new_empty((b, h, n, d_pad), dtype=_I8)
    k_scale = k.new_empty((b, h, -(-n // max(block, 1))), dtype=_F32)
    k_residual = torch.empty_like(k_int8) if residual else None
    if launch is not None:
        launch.call("quant_k_per_block", (k, k_mean, k_int8, k_scale, k_residual), (block, d_pad, residual))
    return [k_int8, k_scale, k_residual] if residual else [k_int8, k_scale]


@_op(FUSED, "(Tensor v, Tensor v_amax, int d_pad, int n_pad, bool permute_keys=False) -> Tensor")
def quant_v_fp8(launch, v, v_amax, d_pad, n_pad, permute_keys=False):
    _need_dims("quant_v_fp8", v=(v, 4))
    vt = v.new_empty((v.shape[0], v.shape[1], d_pad, n_pad), dtype=torch.float8_e4m3fn)
    if launch is not None:
        launch.call("quant_v_fp8", (v, v_amax, vt), (d_pad, n_pad, permute_keys))
    return vt


@_op(FUSED, "(Tensor q, Tensor k, Tensor v, bool smooth_k, float sm_scale, float scale_mul, int d_pad, "
     "bool with_corr) -> (Tensor q_int8, Tensor q_scale, Tensor corr, Tensor k_int8, Tensor k_scale, "
     "Tensor vt, "
     "Tensor v_scale, Tensor k_mean)")  # fmt: skip
def quant_qkv_sm90(launch, q, k, v, smooth_k, sm_scale, scale_mul, d_pad, with_corr):
    _need_dims("quant_qkv_sm90", q=(q, 4), k=(k, 4))
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    n_pad = -(-nk // _KEY_GROUP) * _KEY_GROUP
    parts = (
        q.new_empty((b, hq, nq, d_pad), dtype=_I8),
        q.new_empty((b, hq, nq), dtype=_F32),
        q.new_empty((b if with_corr else 0, hq, nq), dtype=_F32),
        q.new_empty((b, hkv, nk, d_pad), dtype=_I8),
        q.new_empty((b, hkv, -(-nk // _SM90_KEY_BLOCK)), dtype=_F32),
        q.new_empty((b, hkv, d_pad, n_pad), dtype=torch.float8_e4m3fn),
        q.new_empty((b, hkv, d), dtype=_F32),
        q.new_empty((b, hkv, d) if smooth_k else (0,), dtype=_F32),
    )
    if launch is not None:
        floats = _workspace(launch, "sage_quant_qkv_workspace_floats", b, hkv, nk, d_pad)
        workspace = q.new_empty((floats,), dtype=_F32)
        launch.call("quant_qkv_sm90", (q, k, v, *parts, workspace), (smooth_k, d_pad, with_corr),
                    (sm_scale, scale_mul))  # fmt: skip
    return parts


# --------------------------------------------------------------------------------------------------
# sageattention._qattn_sm80 and _qattn_sm89 (mma.sync)


@_op(SM80, "(Tensor q_int8, Tensor k_int8, Tensor v, Tensor q_scale, Tensor k_scale, Tensor? corr, "
     "bool is_causal, bool return_lse, ScalarType out_dtype, bool out_nhd, str pv_accum, "
     "Tensor? k_residual=None) -> (Tensor, Tensor)", lse_output=True)  # fmt: skip
def qk_int8_sv_f16_attn(launch, q_int8, k_int8, v, q_scale, k_scale, corr, is_causal, return_lse, out_dtype,
                        out_nhd, pv_accum, k_residual=None):  # fmt: skip
    _need_dims("qk_int8_sv_f16_attn", v=(v, 4))
    inputs = (q_int8, k_int8, v, q_scale, k_scale, corr, k_residual)
    return _mma_attention("qk_int8_sv_f16_attn", _SM80_ACCUM, launch, inputs, v, v.shape[-1], is_causal,
                          return_lse, out_dtype, out_nhd, pv_accum)  # fmt: skip


@_op(SM89, "(Tensor q_int8, Tensor k_int8, Tensor vt_fp8, Tensor q_scale, Tensor k_scale, Tensor v_scale, "
     "Tensor? corr, bool is_causal, bool return_lse, ScalarType out_dtype, bool out_nhd, str pv_accum) "
     "-> (Tensor, Tensor)", lse_output=True)  # fmt: skip
def qk_int8_sv_f8_attn_sm89(launch, q_int8, k_int8, vt_fp8, q_scale, k_scale, v_scale, corr, is_causal,
                            return_lse, out_dtype, out_nhd, pv_accum):  # fmt: skip
    _need_dims("qk_int8_sv_f8_attn_sm89", v_scale=(v_scale, 3))
    inputs = (q_int8, k_int8, vt_fp8, q_scale, k_scale, v_scale, corr)
    return _mma_attention("qk_int8_sv_f8_attn_sm89", _SM89_ACCUM, launch, inputs, q_int8, v_scale.shape[-1],
                          is_causal, return_lse, out_dtype, out_nhd, pv_accum)  # fmt: skip


def _mma_attention(name, accums, launch, inputs, like, head_dim, is_causal, return_lse, out_dtype, out_nhd,
                   pv_accum):  # fmt: skip
    """The mma.sync attention ops: outputs [B, Hq, Nq, head_dim] like ``like`` (and the LSE), then the
    launch on ``inputs`` (q_int8 first) with the accumulation's code from ``accums``."""
    q_int8 = inputs[0]
    _need_dims(name, q_int8=(q_int8, 4))
    accum = _accum(name, accums, pv_accum)
    b, hq, nq, _ = q_int8.shape
    out, lse = _attn_outputs(like, b, hq, nq, head_dim, out_dtype, out_nhd, return_lse)
    if launch is not None:
        launch.call(name, (*inputs, out, lse), (is_causal, return_lse, accum))
    return out, lse


def fp16_accum_built() -> bool:
    """Whether _qattn_sm89 holds the "fp32+fp16" kernels (the FP16-accumulating FP8 MMA needs CUDA >=
    12.8 at build time). False when the module is not built. A dict read once registered, which
    torch.compile traces (a ctypes call it would not)."""
    return register(SM89) and _flags.get("sm89_fp16_accum", False)


# --------------------------------------------------------------------------------------------------
# sageattention._qattn_sm90 (wgmma, TMA)


@_op(SM90, "(int batch, int heads_q, int nq, int nk, int d_pad, bool causal, int sms) -> int[]")
def sm90_split_plan(launch, batch, heads_q, nq, nk, d_pad, causal, sms):
    launch = launch if launch is not None else _native.load(SM90)[0]  # host arithmetic: fake = real
    ret = launch.call("sm90_split_plan", (), (batch, heads_q, nq, nk, d_pad, causal, sms), device=-1)
    return list(ret[:3])


@_op(SM90, "(Tensor q_int8, Tensor k_int8, Tensor vt_fp8, Tensor q_scale, Tensor k_scale, Tensor v_scale, "
     "Tensor? corr, bool is_causal, bool return_lse, ScalarType out_dtype, bool out_nhd) -> (Tensor, Tensor)",
     lse_output=True)  # fmt: skip
def qk_int8_sv_f8_attn_sm90(launch, q_int8, k_int8, vt_fp8, q_scale, k_scale, v_scale, corr, is_causal,
                            return_lse, out_dtype, out_nhd):  # fmt: skip
    name = "qk_int8_sv_f8_attn_sm90"
    _need_dims(name, q_int8=(q_int8, 4), k_int8=(k_int8, 4), v_scale=(v_scale, 3))
    b, hq, nq, d_pad = q_int8.shape
    out, lse = _attn_outputs(q_int8, b, hq, nq, v_scale.shape[-1], out_dtype, out_nhd, return_lse)
    if launch is not None:
        nk, device = k_int8.shape[2], q_int8.get_device()
        if device < 0:
            raise RuntimeError(
                f"sageattention::{name}: q_int8 must be a CUDA tensor, got one on {q_int8.device}"
            )
        size = _workspace(launch, "sage_qk_int8_sv_f8_attn_sm90_workspace_bytes", b, hq, nq, nk, d_pad,
                          is_causal, device)  # fmt: skip
        workspace = _scratch(q_int8, size)
        launch.call(name, (q_int8, k_int8, vt_fp8, q_scale, k_scale, v_scale, corr, out, lse, workspace),
                    (is_causal, return_lse))  # fmt: skip
    return out, lse


@_op(SM90, "(Tensor q, Tensor k, Tensor v, bool is_causal, float sm_scale, float scale_mul, int d_pad, "
     "bool smooth_k, bool return_lse, bool out_nhd, Tensor? key_mask=None) -> (Tensor, Tensor)",
     lse_output=True)  # fmt: skip
def attn_sm90(launch, q, k, v, is_causal, sm_scale, scale_mul, d_pad, smooth_k, return_lse, out_nhd,
              key_mask=None):  # fmt: skip
    if q.dim() != 4 or k.dim() != 4:
        _need_dims("attn_sm90", q=(q, 4), k=(k, 4))
    if launch is None:
        b, hq, nq, d = q.shape
        return _attn_outputs(q, b, hq, nq, d, q.dtype, out_nhd, return_lse)
    # The call packed once per signature (everything but the data pointers): the sm_90a path is the one
    # whose host time short sequences feel (bench/host_native.py).
    key = (q.shape, q.stride(), q.dtype, q.get_device(), k.shape, k.stride(), k.dtype, k.get_device(),
           v.shape, v.stride(), v.dtype, v.get_device(), is_causal, sm_scale, scale_mul, d_pad, smooth_k,
           return_lse, out_nhd, key_mask is not None and (key_mask.shape, key_mask.stride()))  # fmt: skip
    call = _attn_plans.get(key)
    if call is None:
        call = Sm90Call(launch, q, k, v, is_causal, sm_scale, scale_mul, d_pad, smooth_k, return_lse, out_nhd,
                        key_mask=key_mask)  # fmt: skip
        if len(_attn_plans) >= _MAX_PLANS:
            _attn_plans.clear()
        _attn_plans[key] = call
    return call(q, k, v) if key_mask is None else call(q, k, v, key_mask)


class Sm90Call:
    """``attn_sm90`` for one call signature: its arguments packed once (``_native.Plan``), so that a call
    allocates the outputs and the workspace, puts in the data pointers and launches, nothing more.

    ``q``, ``k``, ``v``: HND views ([B, H, N, D]) of the signature's tensors. A call takes tensors of that
    signature, as HND views or, with ``nhd_view``, as the [B, N, H, D] tensors whose transposes those
    views are (the data pointers are the same), and returns (out, lse): out a [B, Hq, Nq, D] view, or
    [B, Nq, Hq, D] with ``nhd_view``, over memory ordered [B, Nq, Hq, D] when ``out_nhd`` (otherwise
    [B, Hq, Nq, D]); lse [B, Hq, Nq] float32, or None without ``return_lse``. Made with ``key_mask`` (a
    uint8 [B, Nk] view, ``cuda_sm90.key_rows``), a call takes a fourth tensor, that view or the mask it
    views, of the same signature (only its data pointer is read)."""

    __slots__ = ("device", "dtype", "lse_shape", "out_shape", "out_strides", "plan", "return_lse", "size")

    def __init__(self, launch, q, k, v, is_causal, sm_scale, scale_mul, d_pad, smooth_k, return_lse, out_nhd,
                 nhd_view=False, key_mask=None):  # fmt: skip
        device = q.get_device()
        if device < 0:
            raise RuntimeError(f"sageattention::attn_sm90: q must be a CUDA tensor, got one on {q.device}")
        b, hq, nq, d = q.shape
        hkv, nk = k.shape[1], k.shape[2]
        out, lse = _attn_outputs(q, b, hq, nq, d, q.dtype, out_nhd, return_lse)
        self.size = _workspace(launch, "sage_attn_sm90_workspace_bytes", b, hq, hkv, nq, nk, d, d_pad,
                               smooth_k, return_lse and smooth_k, is_causal, device)  # fmt: skip
        tensors = (q, k, v, out, lse, _scratch(q, self.size), key_mask)
        self.plan = _native.Plan(launch, "attn_sm90", tensors, (is_causal, d_pad, smooth_k, return_lse),
                                 (sm_scale, scale_mul))  # fmt: skip
        self.device, self.dtype, self.return_lse, self.lse_shape = device, q.dtype, return_lse, (b, hq, nq)
        shape, strides = out.shape, out.stride()
        if nhd_view:
            shape, strides = (shape[0], shape[2], shape[1], shape[3]), (strides[0], strides[2], strides[1], 1)
        self.out_shape, self.out_strides = tuple(shape), tuple(strides)

    def __call__(self, q, k, v, *keys):  # keys: the key mask, where the plan was made with one
        out = q.new_empty_strided(self.out_shape, self.out_strides, dtype=self.dtype)
        workspace = q.new_empty_strided((self.size,), (1,), dtype=torch.uint8)
        if self.return_lse:
            b, hq, nq = self.lse_shape
            lse = q.new_empty_strided(self.lse_shape, (hq * nq, nq, 1), dtype=_F32)
            self.plan.run((q, k, v, out, lse, workspace, *keys), self.device)
            return out, lse
        self.plan.run((q, k, v, out, workspace, *keys), self.device)
        return out, None


def sm90_call(q, k, v, is_causal, sm_scale, scale_mul, d_pad, smooth_k, return_lse, out_nhd, nhd_view,
              key_mask=None):  # fmt: skip
    """An ``Sm90Call`` for eager calls of this signature, or None where ``_qattn_sm90`` is not loaded."""
    if not register(SM90):
        return None
    launch = _native.load(SM90)[0]
    return Sm90Call(launch, q, k, v, is_causal, sm_scale, scale_mul, d_pad, smooth_k, return_lse, out_nhd,
                    nhd_view, key_mask)  # fmt: skip


#: attn_sm90's calls by signature; cleared when full (a model calls a few shapes, a sweep many).
_attn_plans: dict[tuple, Sm90Call] = {}
_MAX_PLANS = 256


# --------------------------------------------------------------------------------------------------
# Registration and calls

_library: list = []  # [torch.library.Library], made on the first definition and kept alive
_registered: dict[str, bool] = {}
_reasons: dict[str, str] = {}
_flags: dict[str, bool] = {}  # what a module says of its build, read once at registration


def _op_form(spec: OpSpec, outputs, like):
    if spec.lse_output and outputs[1] is None:
        return outputs[0], like.new_empty((0,), dtype=_F32)
    return outputs


def _define(spec: OpSpec, launch: _native.Library) -> None:
    if not _library:
        _library.append(torch.library.Library("sageattention", "FRAGMENT"))
    lib = _library[0]
    lib.define(spec.name + spec.schema)

    def real(*args):
        return _op_form(spec, spec.body(launch, *args), args[0] if args else None)

    def fake(*args):
        return _op_form(spec, spec.body(None, *args), args[0] if args else None)

    if spec.schema.startswith("(Tensor"):
        lib.impl(spec.name, real, "CUDA")
        torch.library.register_fake(f"sageattention::{spec.name}", fake, lib=lib)
    else:  # no tensor argument to dispatch on
        lib.impl(spec.name, real, "CompositeExplicitAutograd")


def register(module: str) -> bool:
    """Define ``sageattention.<module>``'s ops once; False (with the reason kept) when it cannot load."""
    if module not in _registered:
        launch, reason = _native.load(module)
        if launch is None:
            _registered[module] = False
            _reasons[module] = reason or "not loaded"
        else:
            for spec in OPS.values():
                if spec.module == module:
                    _define(spec, launch)
            if module == SM89:
                _flags["sm89_fp16_accum"] = bool(
                    launch.function("sage_sm89_fp16_accum_built", ctypes.c_int, [])()
                )
            _registered[module] = True
    return _registered[module]


def registered(module: str = SM80) -> bool:
    """True when ``module``'s ops are defined (``module``: "_fused", "_qattn_sm80", ... or dotted)."""
    return _registered.get(module.rsplit(".", 1)[-1], False)


def unavailable_reason(module: str = SM80) -> str | None:
    """Why ``module``'s ops are not defined (None when they are)."""
    return _reasons.get(module.rsplit(".", 1)[-1])


def call(name: str, *args):
    """Op ``name`` on ``args``: under torch.compile the op itself (so the graph holds it), otherwise its
    function directly. The LSE of an attention op is None when not asked for in eager calls and an
    empty tensor in compiled ones: callers read it only with return_lse."""
    direct = _direct.get(name)
    if direct is None:
        spec = OPS[name]
        if not register(spec.module):
            raise RuntimeError(f"sageattention.{spec.module} is not available: {_reasons[spec.module]}")
        direct = _direct[name] = (spec.body, _native.load(spec.module)[0])
    if torch.compiler.is_compiling():
        return getattr(torch.ops.sageattention, name)(*args)
    return direct[0](direct[1], *args)


_direct: dict[str, tuple] = {}  # name -> (function, module functions), once its module is registered


for _module in (FUSED, SM80, SM89, SM90):
    register(_module)
