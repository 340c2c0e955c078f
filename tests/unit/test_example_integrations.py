"""sageattention.integrations.diffusers and .transformers on the CPU, with tiny models built from configs
by the scripts example/diffusers_backend.py and example/transformers_attention.py (random weights, no
download): every attention call of the model reaches sageattn (run here by the ``triton_standin``
fixture: the simulated quantization on CPU tensors), the outputs agree with the SDPA run, the processors
keep their signatures, the padding mask reaches sageattn, and the calls sageattn cannot serve exactly
reach SDPA. Skipped where diffusers or transformers is missing.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

from example.measure import cosine
from sageattention.integrations import sdpa as smp

# Simulated FP8 P·V on tiny random models; the GPU test holds the real kernels to 0.999.
COS = 0.999


@pytest.fixture(autouse=True)
def _quiet():
    smp.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    smp.reset()


# --------------------------------------------------------------------------------------------------
# transformers


@pytest.fixture
def llama(triton_standin):
    pytest.importorskip("transformers")
    from example import transformers_attention as ta
    from sageattention.integrations import transformers as integration

    integration.register(devices=("cpu",))
    integration.reset()
    model = ta.build_llama("tiny", "cpu")
    ta.attention_sensitive(model)
    yield ta, model
    integration.register(devices=("cuda",))


def test_registered_attention_serves_every_layer(llama, triton_standin):
    ta, model = llama
    ids = ta.token_ids(model, 1, 64)
    with torch.no_grad():
        with ta.implementation(model, "sdpa"):
            ref = model(input_ids=ids, use_cache=False).logits
        with ta.implementation(model, ta.NAME):
            out = model(input_ids=ids, use_cache=False).logits
    layers = model.config.num_hidden_layers
    assert ta.calls() == {ta.NAME: layers} and len(triton_standin.calls) == layers
    call = triton_standin.calls[0]
    assert call["is_causal"] and call["attn_mask"] is None  # causal by flag, as transformers' SDPA
    assert call["q"].shape[1] == model.config.num_attention_heads
    assert call["k"].shape[1] == model.config.num_key_value_heads  # GQA without repeating K, V
    assert model.config._attn_implementation == "sdpa"  # implementation() put it back
    assert cosine(out, ref) >= COS


def test_padding_reaches_sageattn_as_a_mask(llama, triton_standin):
    ta, model = llama
    ids = ta.token_ids(model, 2, 48)
    mask = torch.ones_like(ids)
    mask[1, :12] = 0
    rows = {r["attention"]: r for r in ta.compare(model, ids, mask, reps=1)}
    masks = [c["attn_mask"] for c in triton_standin.calls]
    assert masks and all(m is not None and m.dtype == torch.bool for m in masks)
    for name in (f'attn_implementation="{ta.NAME}"', ta.PATCH):
        assert rows[name]["cos vs sdpa"] >= COS, rows


def test_training_goes_to_sageattn_and_float32_to_transformers_sdpa(llama, triton_standin):
    ta, model = llama
    ids = ta.token_ids(model, 1, 32)
    with ta.implementation(model, ta.NAME):
        model.train()
        model(input_ids=ids, use_cache=False).logits.float().sum().backward()  # sageattn backward
        assert triton_standin.calls
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        model.zero_grad(set_to_none=True)
        model.eval()
        with torch.no_grad():
            model.float()(input_ids=ids, use_cache=False)  # float32: SDPA
    reasons = " | ".join(ta.calls())
    assert ta.NAME in ta.calls() and "dtype torch.float32" in reasons and "gradient" not in reasons


def test_compare_reports_every_path_and_the_control(llama):
    ta, model = llama
    rows = ta.compare(model, ta.token_ids(model, 1, 32), reps=1)
    names = [r["attention"] for r in rows]
    assert names == [ta.SDPA, f'attn_implementation="{ta.NAME}"', ta.PATCH, ta.CONTROL]
    assert all(r["cos vs sdpa"] >= COS for r in rows[:-1])


# --------------------------------------------------------------------------------------------------
# diffusers


@pytest.fixture
def flux(triton_standin):
    pytest.importorskip("diffusers")
    from example import diffusers_backend as db

    model = db.attention_sensitive(db.build_flux("tiny", "cpu"))
    return db, model, db.flux_inputs(model, image_tokens=64, text_tokens=16)


def test_processors_route_attention_to_sageattn(flux, triton_standin):
    from sageattention.integrations.diffusers import sage_processor, sage_processors

    db, model, inputs = flux
    originals = model.attn_processors
    wrapped = sage_processors(model, devices=("cpu",), warn=False)
    for name, processor in wrapped.items():
        before = inspect.signature(originals[name].__call__)
        assert inspect.signature(processor.__call__) == before  # diffusers reads it to pass arguments
        assert isinstance(processor, type(originals[name]))
        assert sage_processor(processor) is processor  # wrapping twice changes nothing
    with torch.no_grad():
        ref = model(**inputs, return_dict=False)[0]
        model.set_attn_processor(dict(wrapped))  # a copy: set_attn_processor empties the dict it gets
        out = model(**inputs, return_dict=False)[0]
        model.set_attn_processor(originals)
    blocks = model.config.num_layers + model.config.num_single_layers
    assert len(triton_standin.calls) == blocks
    assert sum(p._sage_patch.calls[smp.SAGE] for p in wrapped.values()) == blocks
    assert cosine(out, ref) >= COS


def test_compare_runs_every_path(flux):
    db, model, inputs = flux
    rows = {r["attention"]: r for r in db.compare(model, inputs, reps=1)}
    assert db.SDPA in rows and db.CONTROL in rows and "sage_processors" in rows
    backend = rows['set_attention_backend("sage")']
    # The dispatcher's "sage" backend needs sageattention installed as a package (its version is read).
    assert "note" in backend or backend["cos vs sdpa"] >= COS
    assert rows["sage_processors"]["cos vs sdpa"] >= COS
    # On the CPU (no devices=("cpu",) here) the processors and the patch give the call to SDPA itself.
    assert rows[db.PATCH]["cos vs sdpa"] == pytest.approx(1.0, abs=1e-9)


def test_attention_sensitive_init_makes_the_control_move(flux):
    """The reason for attention_sensitive: afterwards a wrong attention visibly changes the output."""
    db, model, inputs = flux
    from example.measure import uniform_attention

    model.set_attention_backend("native")
    with torch.no_grad():
        ref = model(**inputs, return_dict=False)[0]
        with uniform_attention():
            blind = model(**inputs, return_dict=False)[0]
    assert cosine(blind, ref) < 0.995
