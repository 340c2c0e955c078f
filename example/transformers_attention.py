"""sageattention.integrations.transformers, measured on a Llama-style model with random weights.

The integration itself is part of the package (nothing here is needed to use it):

    from sageattention.integrations.transformers import register
    register()                                    # adds "sageattn" to transformers' AttentionInterface
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="sageattn")

Run as a script, this builds a model from a config (no download), runs one prefill with "sdpa", with
"sageattn", and with "sdpa" under the process-wide SDPA patch (sageattention.integrations.sdpa), and
prints the cosine similarity of the logits against the SDPA run and the times; first with the random
weights as built, then after ``attention_sensitive`` (see there: at random init the output is the
attentions' alone).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as `python example/transformers_attention.py`
    sys.path.append(str(Path(__file__).resolve().parents[1]))

from example.measure import (  # noqa: E402
    CONTROL,
    cosine,
    cudnn_first,
    default_device,
    describe,
    format_table,
    time_ms,
    uniform_attention,
)
from sageattention.integrations.sdpa import patched  # noqa: E402
from sageattention.integrations.transformers import NAME, calls, register  # noqa: E402

__all__ = ["NAME", "attention_sensitive", "build_llama", "calls", "compare", "implementation", "token_ids"]

# --------------------------------------------------------------------------------------------------
# A Llama-style model from a config, random weights

LLAMA_SIZES = {
    # Two decoder layers of Llama-3-8B's shape (GQA 32/8 heads of 128); a small vocabulary.
    "8b-layers": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_hidden_layers": 2,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
    },
    # For CPU checks: the same structure, tiny.
    "tiny": {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 512,
        "max_position_embeddings": 1024,
    },
}


def build_llama(size: str = "8b-layers", device=None, dtype=torch.bfloat16, seed: int = 0, **overrides):
    """A LlamaForCausalLM from a config with random weights, in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415

    device = torch.device(device) if device is not None else default_device()
    config = LlamaConfig(**{**LLAMA_SIZES[size], **overrides})
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def token_ids(model, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (batch, length), generator=gen)
    return ids.to(model.device)


@contextlib.contextmanager
def implementation(model, name: str):
    """``with implementation(model, "sageattn"):`` the model runs with that attention, then as before."""
    before = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield model
    finally:
        model.set_attn_implementation(before)


def attention_sensitive(model, embedding_std: float = 1.0):
    """Re-initialize the token embeddings of a random Llama model with a standard deviation of 1.

    At random initialization every weight has a standard deviation of 0.02, the embeddings too, so the
    residual stream entering the first layer is some 15 times smaller than the attention output added
    to it (0.02 against 0.3 in the 8b-layers shape): nothing but the attentions, and the MLPs they
    feed, reaches the output, and their rounding errors pile up layer on layer. In a trained model the
    residual stream carries each token through the layers and attention adds to it. Unit-scale
    embeddings (the scale the RMSNorm in front of each attention produces anyway) give it that role;
    the negative control of ``compare`` (uniform attention) shows the output still depends on
    attention.
    """
    gen = torch.Generator(device="cpu").manual_seed(1)
    weight = model.get_input_embeddings().weight
    with torch.no_grad():
        weight.copy_(torch.randn(weight.shape, generator=gen) * embedding_std)
    return model


SDPA = "sdpa"
#: The row of the process-wide SDPA patch (sageattention.integrations.sdpa) in compare's table.
PATCH = "sdpa + sageattention SDPA patch"


def compare(model, ids: torch.Tensor, attention_mask=None, reps: int = 5, cudnn: bool = True) -> list[dict]:
    """One forward pass (a prefill, no cache) per attention path: cosine of the logits against the SDPA
    run (valid positions only, with a mask), milliseconds, speedup over SDPA. The last row is the
    negative control (uniform attention, not timed)."""
    register()
    device = model.device
    kwargs = {"input_ids": ids, "attention_mask": attention_mask, "use_cache": False}

    def forward():
        with torch.no_grad():
            return model(**kwargs).logits

    def run():
        return forward(), time_ms(forward, device, reps=reps)

    runs = {}
    with implementation(model, "sdpa"):
        runs[SDPA] = run()
        if cudnn and device.type == "cuda":
            with cudnn_first():
                runs["sdpa, cuDNN first"] = run()
    with implementation(model, NAME):
        runs[f'attn_implementation="{NAME}"'] = run()
    with implementation(model, "sdpa"), patched(warn=False):
        runs[PATCH] = run()
    with implementation(model, "sdpa"), uniform_attention():
        runs[CONTROL] = (forward(), None)

    valid = slice(None) if attention_mask is None else attention_mask.bool()
    ref, ref_ms = runs[SDPA]
    rows = []
    for name, (out, ms) in runs.items():
        row = {"attention": name, "cos vs sdpa": cosine(out[valid], ref[valid])}
        if ms is not None:
            row.update({"ms": ms, "speedup": ref_ms / ms})
        rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(LLAMA_SIZES), help="8b-layers on a GPU, else tiny")
    parser.add_argument("--tokens", type=int, help="prefill length (8192 on a GPU, else 128)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    device = default_device()
    gpu = device.type == "cuda"
    size, tokens = args.size or ("8b-layers" if gpu else "tiny"), args.tokens or (8192 if gpu else 128)
    register()
    model = build_llama(size, device)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"device: {describe(device)}")
    print(f"model: LlamaForCausalLM {size} ({params:.3g}M parameters, random), bf16, prefill, no cache")
    columns = ["attention", "cos vs sdpa", "ms", "speedup"]
    for init in ("random init", "attention-sensitive init"):
        if init != "random init":
            attention_sensitive(model)
        print(f"{init}, {args.batch} x {tokens} tokens:")
        print(format_table(compare(model, token_ids(model, args.batch, tokens), reps=args.reps), columns))
        # A padded batch: the mask path (sageattn gets transformers' 4-D bool mask).
        ids = token_ids(model, 2, min(tokens, 1024), seed=1)
        mask = torch.ones_like(ids)
        mask[1, : ids.shape[1] // 4] = 0  # left padding on the second row
        print(f"{init}, padded batch of 2 x {ids.shape[1]} (a quarter of row 2 is padding), valid positions:")
        print(format_table(compare(model, ids, mask, reps=2, cudnn=False), columns[:3]))
    print(f"calls of the registered function: {calls()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
