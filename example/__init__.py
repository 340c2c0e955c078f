"""How to use sageattention from real clients: each module is a script and a library.

* ``sdpa_monkeypatch``: every ``torch.nn.functional.scaled_dot_product_attention`` call of the process
  goes to ``sageattn``, and the calls it cannot serve exactly go to the original function.
* ``diffusers_backend``: diffusers' attention backend ``"sage"``, and a processor that wraps any
  attention processor, on a Flux-style transformer built from a config with random weights.
* ``transformers_attention``: an attention function registered with transformers'
  ``AttentionInterface``, on a Llama-style model built from a config with random weights.

Run one as ``python example/NAME.py`` (``--help`` lists its options); the tests import the same
functions (tests/unit/test_example_*.py on the CPU, tests/gpu/test_integration.py on a GPU).
"""
