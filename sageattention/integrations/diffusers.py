"""SageAttention in diffusers, through its attention processors.

    from sageattention.integrations.diffusers import sage_processors
    pipe.transformer.set_attn_processor(sage_processors(pipe.transformer))

``sage_processor`` wraps a processor: inside it, ``F.scaled_dot_product_attention`` goes to sageattn
with the rules of ``sageattention.integrations.sdpa`` (masks kept, anything sageattn cannot compute
the same way goes to torch SDPA, counted in the processor's ``_sage_patch.calls``). It serves any model
with attention processors, including those whose processors call ``F.scaled_dot_product_attention``
themselves (UNets) and diffusers versions without the attention dispatcher. Processors that call the
dispatcher reach torch SDPA through its default "native" backend.

diffusers' own dispatcher has a ``"sage"`` backend that calls ``sageattention.sageattn`` directly
(``model.set_attention_backend("sage")``; it needs sageattention installed as a package and refuses
attention masks); nothing here is needed for it.

diffusers is imported when ``sage_processor`` or ``sage_processors`` is called, never when this
module is imported; without it they raise an ImportError naming it. Checked with diffusers 0.42.1
(``CHECKED_WITH``).
"""

from __future__ import annotations

import copy
import functools

from ._clients import require
from .sdpa import SageSDPA, patched, unpatched

#: The client versions this integration was checked with.
CHECKED_WITH = {"diffusers": "0.42.1"}

_wrapped_classes: dict = {}


def _require() -> None:
    require("diffusers", "sageattention.integrations.diffusers", CHECKED_WITH["diffusers"])


def sage_processor(processor, **options):
    """A copy of ``processor`` whose scaled_dot_product_attention calls go to sageattn.

    ``options`` are SageSDPA's (``masks``, ``devices``, ``warn``). The copy keeps the processor's
    signature, which diffusers reads to decide which arguments to pass. A wrapped processor is
    returned as it is.
    """
    _require()
    base = type(processor)
    if getattr(base, "_sage_wraps", None) is not None:
        return processor
    cls = _wrapped_classes.get(base)
    if cls is None:

        @functools.wraps(base.__call__)  # the signature diffusers inspects is the wrapped one
        def __call__(self, *args, **kwargs):
            with patched(self._sage_patch):
                return base.__call__(self, *args, **kwargs)

        cls = type(f"Sage{base.__name__}", (base,), {"__call__": __call__, "_sage_wraps": base})
        cls.__module__ = __name__
        _wrapped_classes[base] = cls
    wrapped = copy.copy(processor)
    wrapped.__class__ = cls
    wrapped._sage_patch = SageSDPA(unpatched(), **options)
    return wrapped


def sage_processors(model, **options) -> dict:
    """The model's attention processors, each wrapped by sage_processor (for ``set_attn_processor``)."""
    _require()
    return {name: sage_processor(p, **options) for name, p in model.attn_processors.items()}
