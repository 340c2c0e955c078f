"""sageattention inside other code, shipped with the package. Each module imports its client library
only when one of its functions is called, so importing ``sageattention`` or this package never imports
diffusers or transformers, and never changes torch.

* ``sageattention.integrations.sdpa``: every ``torch.nn.functional.scaled_dot_product_attention`` call of
  the process (``install()``) or of a ``with patched():`` block through ``sageattn`` where it computes
  the same, the other calls to the original function, counted with the reason.
  ``python -m sageattention run script.py`` runs a script under it without changing the script.
* ``sageattention.integrations.transformers``: ``register()`` adds ``"sageattn"`` to transformers'
  ``AttentionInterface`` (``attn_implementation="sageattn"``).
* ``sageattention.integrations.diffusers``: ``sage_processors(model)`` wraps a diffusers model's
  attention processors (``model.set_attn_processor(...)``).

Each module's ``CHECKED_WITH`` names the client versions it was checked with. docs/api.md,
"Integrations", documents the options and the fallbacks.
"""

__all__ = ["diffusers", "sdpa", "transformers"]
