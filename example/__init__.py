"""The integrations of sageattention.integrations, measured: each module is a script that prints what it
measured (cosine similarity against torch SDPA, time). The integration code itself is in the package;
nothing here is needed to use it.

* ``sdpa_monkeypatch``: the SDPA patch (sageattention.integrations.sdpa) on single calls, and the time
  of a Flux-sized attention call with and without it.
* ``diffusers_backend``: diffusers' attention backend ``"sage"`` and the processors of
  sageattention.integrations.diffusers, on a Flux-style transformer built from a config with random
  weights.
* ``transformers_attention``: the attention function of sageattention.integrations.transformers, on a
  Llama-style model built from a config with random weights.

Run one as ``python example/NAME.py`` (``--help`` lists its options); the tests use the same models
(tests/unit/test_example_*.py on the CPU, tests/gpu/test_integration.py on a GPU).
"""
