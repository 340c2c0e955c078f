"""Loads the compiled Blackwell extension (`sageattn3._C`) if this build has one.

Importing it registers the ops under ``torch.ops.sageattn3``. When it is missing (a pure-Python
build, or an import error), `load_error` says why; nothing else in the package needs it yet.
"""

from __future__ import annotations

import importlib

load_error: str | None = None
_loaded = False


def load() -> bool:
    """Import the extension once; True when its ops are registered."""
    global load_error, _loaded
    if _loaded or load_error is not None:
        return _loaded
    try:
        importlib.import_module("sageattn3._C")
    except ImportError as exc:  # no compiled module in this build, or it does not load here
        load_error = f"{type(exc).__name__}: {exc}"
        return False
    _loaded = True
    return True


def compiled_families() -> list[str]:
    """Blackwell targets the extension holds SASS for ('sm_100a', 'sm_120a')."""
    if not load():
        return []
    import torch

    bits = int(torch.ops.sageattn3.compiled_families())
    return [name for bit, name in ((1, "sm_100a"), (2, "sm_120a")) if bits & bit]
