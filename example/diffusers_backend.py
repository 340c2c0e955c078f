"""SageAttention in diffusers, measured on a Flux-style transformer built from a config with random
weights. Two ways, neither of which changes diffusers:

1. diffusers' attention dispatcher has a "sage" backend that calls ``sageattention.sageattn``:

       pipe.transformer.set_attention_backend("sage")
       # or for a block of code:  with diffusers.attention_backend("sage"): ...

   diffusers checks that sageattention (>= 2.1.1) is installed, and refuses attention masks on this
   backend (ValueError); models that pass none (Flux, SD3, Wan, ...) are served.

2. The processors of the package (nothing here is needed to use them), for any model with attention
   processors, including those whose processors call ``F.scaled_dot_product_attention`` themselves
   (UNets) and diffusers versions without the dispatcher:

       from sageattention.integrations.diffusers import sage_processors
       pipe.transformer.set_attn_processor(sage_processors(pipe.transformer))

Run as a script, this runs one denoising step of the transformer with torch SDPA, with the "sage"
backend, with the processors and under the process-wide SDPA patch (sageattention.integrations.sdpa),
and prints the cosine similarity of each output against the SDPA run and the times; first with the
random weights as built, then after ``attention_sensitive`` (see there: at random init the output
barely depends on attention).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as `python example/diffusers_backend.py`
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
from sageattention.integrations.diffusers import sage_processors  # noqa: E402
from sageattention.integrations.sdpa import patched  # noqa: E402

__all__ = ["attention_sensitive", "build_flux", "compare", "flux_inputs", "sage_processors"]

# --------------------------------------------------------------------------------------------------
# A Flux-style transformer from a config, random weights

FLUX_SIZES = {
    # Flux.1's block shapes (24 heads of 128, T5 width 4096, 64 latent channels), 2 + 4 blocks
    # instead of 19 + 38: the attention share of one block is what it is in the full model.
    "flux-blocks": {
        "num_layers": 2,
        "num_single_layers": 4,
        "attention_head_dim": 128,
        "num_attention_heads": 24,
        "joint_attention_dim": 4096,
        "pooled_projection_dim": 768,
        "in_channels": 64,
        "axes_dims_rope": (16, 56, 56),
    },
    # For CPU checks: the same structure, tiny.
    "tiny": {
        "num_layers": 1,
        "num_single_layers": 1,
        "attention_head_dim": 32,
        "num_attention_heads": 2,
        "joint_attention_dim": 48,
        "pooled_projection_dim": 24,
        "in_channels": 16,
        "axes_dims_rope": (8, 12, 12),
    },
}


def build_flux(size: str = "flux-blocks", device=None, dtype=torch.bfloat16, seed: int = 0, **overrides):
    """A FluxTransformer2DModel from a config with random weights, in eval mode."""
    from diffusers import FluxTransformer2DModel  # noqa: PLC0415

    device = torch.device(device) if device is not None else default_device()
    torch.manual_seed(seed)
    with torch.device(device):
        model = FluxTransformer2DModel(**{**FLUX_SIZES[size], **overrides})
    return model.to(dtype).eval()


def flux_inputs(
    model, image_tokens: int = 4096, text_tokens: int = 512, batch: int = 1, seed: int = 0
) -> dict:
    """The arguments of one denoising step: a square latent of ``image_tokens`` patches (4096: a 1024x1024
    image), ``text_tokens`` text embeddings, pooled embedding, timestep and position ids."""
    side = math.isqrt(image_tokens)
    if side * side != image_tokens:
        raise ValueError(f"image_tokens={image_tokens} is not a square number")
    config, device, dtype = model.config, model.device, model.dtype
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device, dtype)

    rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    img_ids = torch.stack([torch.zeros_like(rows), rows, cols], dim=-1).reshape(-1, 3)
    return {
        "hidden_states": randn(batch, image_tokens, config.in_channels),
        "encoder_hidden_states": randn(batch, text_tokens, config.joint_attention_dim),
        "pooled_projections": randn(batch, config.pooled_projection_dim),
        "timestep": torch.full((batch,), 0.5, device=device, dtype=dtype),
        "img_ids": img_ids.to(device, dtype),
        "txt_ids": torch.zeros(text_tokens, 3, device=device, dtype=dtype),
    }


def attention_sensitive(model, qk_norm_scale: float = 2.0, modulation_gain: float = 4.0):
    """Re-initialize the two parts of a random Flux model that make its output ignore attention.

    At random initialization the RMSNorm weights of q and k are 1, so the scores have a standard
    deviation of about 1 over thousands of keys: every query averages nearly all values, whatever
    the attention computes. And the adaLN modulation (shift, scale, gate of each block) comes out with
    a standard deviation of about 0.08, so the blocks barely touch the residual stream. A trained
    model's attention is selective, and its gates are not close to zero. Here the q/k norm
    weights become ``qk_norm_scale`` (score deviation about its square) and the modulation weights
    N(0, modulation_gain^2 / fan_in), so shift, scale and gate come out with a deviation of about 1.
    The negative control of ``compare`` (uniform attention) shows the effect: at random init it moves
    the output by almost nothing, after this clearly.
    """
    gen = torch.Generator(device="cpu").manual_seed(1)
    with torch.no_grad():
        for name, module in model.named_modules():
            if (
                name.endswith(("norm_q", "norm_k", "norm_added_q", "norm_added_k"))
                and module.weight is not None
            ):
                module.weight.fill_(qk_norm_scale)
            elif name.endswith(("norm1.linear", "norm1_context.linear", "norm.linear")):
                std = modulation_gain / module.in_features**0.5
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * std)
                if module.bias is not None:
                    module.bias.zero_()
    return model


SDPA = "torch SDPA (native)"
#: The row of the process-wide SDPA patch (sageattention.integrations.sdpa) in compare's table.
PATCH = "native + sageattention SDPA patch"


def compare(model, inputs: dict, reps: int = 5, cudnn: bool = True) -> list[dict]:
    """One forward pass per attention path: cosine of the output against the torch SDPA run,
    milliseconds, speedup over it. A path that cannot run here gets its reason in "note". The last
    row is the negative control (uniform attention, not timed)."""
    device = model.device

    def forward():
        with torch.no_grad():
            return model(**inputs, return_dict=False)[0]

    def run():
        return forward(), time_ms(forward, device, reps=reps)

    runs, notes = {}, {}
    model.set_attention_backend("native")
    runs[SDPA] = run()
    if cudnn and device.type == "cuda":
        with cudnn_first():
            runs["torch SDPA, cuDNN first"] = run()
    try:
        model.set_attention_backend("sage")
    except (RuntimeError, ValueError) as exc:  # sageattention not installed as a package, or too old
        notes['set_attention_backend("sage")'] = f"not available: {exc}"
    else:
        try:
            runs['set_attention_backend("sage")'] = run()
        finally:
            model.set_attention_backend("native")
    originals = model.attn_processors
    model.set_attn_processor(sage_processors(model, warn=False))
    try:
        runs["sage_processors"] = run()
    finally:
        model.set_attn_processor(originals)
    with patched(warn=False):
        runs[PATCH] = run()
    with uniform_attention():
        runs[CONTROL] = (forward(), None)

    ref, ref_ms = runs[SDPA]
    rows = []
    for name, (out, ms) in runs.items():
        row = {"attention": name, "cos vs sdpa": cosine(out, ref)}
        if ms is not None:
            row.update({"ms": ms, "speedup": ref_ms / ms})
        rows.append(row)
    rows += [{"attention": name, "note": note} for name, note in notes.items()]
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(FLUX_SIZES), help="flux-blocks on a GPU, else tiny")
    parser.add_argument("--image-tokens", type=int, nargs="+", help="4096 16384 on a GPU, else 256")
    parser.add_argument("--text-tokens", type=int, default=512)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    from diffusers.utils import logging  # noqa: PLC0415

    logging.set_verbosity_error()  # "attention backends are experimental", once per switch
    device = default_device()
    gpu = device.type == "cuda"
    size = args.size or ("flux-blocks" if gpu else "tiny")
    model = build_flux(size, device)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"device: {describe(device)}")
    print(f"model: FluxTransformer2DModel {size} ({params:.3g}M parameters, random), bf16, one step")
    columns = ["attention", "cos vs sdpa", "ms", "speedup", "note"]
    for init in ("random init", "attention-sensitive init"):
        if init != "random init":
            attention_sensitive(model)
        for image_tokens in args.image_tokens or ([4096, 16384] if gpu else [256]):
            text_tokens = args.text_tokens if gpu else min(args.text_tokens, 32)
            print(f"{init}, {image_tokens} image tokens + {text_tokens} text tokens:")
            print(
                format_table(
                    compare(model, flux_inputs(model, image_tokens, text_tokens), args.reps), columns
                )
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
