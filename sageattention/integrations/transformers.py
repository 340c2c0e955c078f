"""SageAttention as a transformers attention implementation.

    from sageattention.integrations.transformers import register
    register()                                    # adds "sageattn" to transformers' AttentionInterface
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="sageattn")
    model.set_attn_implementation("sageattn")     # or switch a loaded model

The registered function takes the arguments transformers gives its own "sdpa" function and follows its
rules (causal through ``is_causal`` when there is no mask, the 4-D bool mask otherwise, grouped-query
attention without repeating K and V). The mask function registered next to it is transformers' SDPA
mask, so padded batches get the mask SDPA would get. Training runs through sageattn as well (its
backward gives dQ, dK and dV); calls sageattn cannot compute the same way go to transformers' own SDPA
function, unchanged: the tensor-level rules are those of ``sageattention.integrations.sdpa`` (dropout
while training, float32, CPU tensors, head dims or masks no quantized kernel takes, ...), and this
module adds a position bias, attention sinks (``s_aux``) and ``output_attentions``. Each reason warns
once (``SDPAFallbackWarning``) and is counted in ``calls()``.

transformers is imported by ``register()`` and by the fallback, never when this module is imported;
without it, ``register()`` raises an ImportError naming it. Checked with transformers 5.17.0
(``CHECKED_WITH``).
"""

from __future__ import annotations

import warnings

import torch

from ..core import sageattn
from ._clients import require
from .sdpa import SageSDPA, SDPAFallbackWarning

#: The client versions this integration was checked with.
CHECKED_WITH = {"transformers": "5.17.0"}
#: The name registered by default (``attn_implementation="sageattn"``).
NAME = "sageattn"

# The tensor-level rules (dtype, device, shapes, head dim, mask, dropout) are the ones of the SDPA
# patch; only the decision is used here, the call itself is made below.
_RULES = SageSDPA(None, warn=False)
_calls: dict = {}
_warned: set = set()


def calls() -> dict:
    """How many calls of the registered function went to sageattn and to SDPA (with the reason)."""
    return dict(_calls)


def reset() -> None:
    """Forget the counts and the warnings given."""
    _calls.clear()
    _warned.clear()


def sageattn_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """An attention function for transformers' AttentionInterface.

    query ``[batch, heads, q_len, head_dim]``, key and value ``[batch, kv_heads, kv_len, head_dim]``
    (transformers' layout); returns ``(out [batch, q_len, heads, head_dim], None)``.
    """
    reason = None
    if kwargs.get("position_bias") is not None or kwargs.get("s_aux") is not None:
        reason = "a position bias or attention sinks"
    elif kwargs.get("output_attentions"):
        reason = "output_attentions"
    else:
        reason = _RULES.why_not(
            query, key, value, attention_mask, dropout, False, scaling, enable_gqa=True
        )  # fmt: skip
    if reason is not None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: PLC0415

        if not torch.compiler.is_compiling():
            _count(f"sdpa: {reason}")
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal,
            **kwargs,
        )  # fmt: skip

    q_len, kv_len = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # As transformers' SDPA function: causal masking by flag only without a mask and beyond one query.
    causal = bool(causal) and q_len > 1 and attention_mask is None
    if causal and kv_len > q_len:
        # A prefill into an empty static cache: keys past the prompt are unused slots that top-left
        # causal masking (sageattn's, as SDPA's) never reaches; leave them out of the work.
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    extra = {} if attention_mask is None else {"attn_mask": attention_mask}
    if not torch.compiler.is_compiling():
        _count(NAME)
    # Passing transposed views as "NHD" costs no copy, and sageattn then allocates its output as
    # [batch, q_len, heads, head_dim] in memory: the layout transformers wants back.
    out = sageattn(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), tensor_layout="NHD",
        is_causal=causal, sm_scale=scaling, **extra,
    )  # fmt: skip
    return out, None


def _count(what: str) -> None:
    _calls[what] = _calls.get(what, 0) + 1
    if what != NAME and what not in _warned:
        _warned.add(what)
        warnings.warn(
            f"sageattention.integrations.transformers: {what}; this call goes to SDPA",
            SDPAFallbackWarning,
            stacklevel=3,
        )


def register(name: str = NAME, devices=None) -> str:
    """Register the function and SDPA's mask function under ``name``; returns the name. ``devices``:
    the device types whose tensors may go to sageattn (default: as before, at first ``("cuda",)``, since
    the quantized kernels need a CUDA GPU; None keeps the current setting)."""
    require("transformers", "sageattention.integrations.transformers", CHECKED_WITH["transformers"])
    from transformers import AttentionInterface  # noqa: PLC0415
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # noqa: PLC0415

    if devices is not None:
        _RULES.devices = tuple(devices)
    AttentionInterface.register(name, sageattn_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
