"""Fine-tuning parity: the same small transformer trained from the same seed with sageattn and with SDPA.

A decoder-only transformer (pre-norm, causal self-attention, GELU MLP) learns a generated task that
needs attention: each sequence is a random block of tokens repeated, so after the first block the next
token is found by looking back (an induction task; no download, the data is made from the seed). Both
runs see the same batches in the same order from the same initial weights; only the attention call
differs. Attention runs in bfloat16 (q, k, v cast, the output cast back), the rest in
float32, for both runs.

    python bench/finetune_parity.py                    # GPU: 4 layers, 1024 tokens, 600 steps
    python bench/finetune_parity.py --smoke            # tiny, seconds on a CPU (sageattn runs SDPA there)

Trains each of --seeds seeds (default 3) with SDPA and with sageattn, once per backward (--variants:
"sageattn", the device's default high-precision backward, and "sageattn int8", the quantized one).
Writes JSON (--out) with every loss curve and the ratios of the final losses (each trained model's mean
loss on the same held-out batches, averaged over the seeds, sageattn / SDPA, and each seed's), and a
PNG of the curves (--png; when matplotlib is importable). The issue's bar: the mean ratio within 1% of
1 with the high-precision backward, 3% with the quantized one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import re
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[1]))

import sageattention as sa  # noqa: E402
from sageattention import autograd  # noqa: E402

FULL = {
    "layers": 4,
    "d_model": 512,
    "heads": 4,
    "seq": 1024,
    "batch": 8,
    "vocab": 32,
    "period": 8,
    "noise": 0.1,
    "steps": 600,
    "eval_batches": 16,
    "lr": 1e-3,
}
SMOKE = {"layers": 2, "d_model": 64, "heads": 2, "seq": 64, "batch": 4, "vocab": 32, "period": 8,
         "noise": 0.1, "steps": 30, "eval_batches": 2, "lr": 3e-3}  # fmt: skip
ATTN_DTYPE = torch.bfloat16


def sdpa_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def sage_attention(q, k, v):
    return sa.sageattn(q, k, v, tensor_layout="HND", is_causal=True)


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, c // self.heads)
        q, k, v = (qkv[:, :, i].transpose(1, 2).to(ATTN_DTYPE) for i in range(3))  # [b, h, n, d]
        att = self.attention(q, k, v).to(x.dtype).transpose(1, 2).reshape(b, n, c)
        x = x + self.proj(att)
        return x + self.mlp(self.norm2(x))


def sinusoids(n: int, d: int) -> torch.Tensor:
    """Fixed sinusoidal positions [n, d]: a look back by a fixed offset is a rotation of them, which the
    query and key projections learn quickly."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, d, 2, dtype=torch.float32) / d)
    return torch.cat([torch.sin(pos * freq), torch.cos(pos * freq)], dim=1)


class TinyLM(nn.Module):
    def __init__(self, cfg: dict, attention):
        super().__init__()
        self.embed = nn.Embedding(cfg["vocab"], cfg["d_model"])
        self.register_buffer("pos", sinusoids(cfg["seq"], cfg["d_model"]), persistent=False)
        self.blocks = nn.ModuleList(
            Block(cfg["d_model"], cfg["heads"], attention) for _ in range(cfg["layers"])
        )
        self.norm = nn.LayerNorm(cfg["d_model"])
        self.head = nn.Linear(cfg["d_model"], cfg["vocab"], bias=False)

    def forward(self, ids):
        x = self.embed(ids) + self.pos[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def batches(cfg: dict, device, seed: int, count: int | None = None):
    """Induction data: a random block of ``period`` tokens, repeated to the sequence's length. From the
    second block on, each next token is the one after the previous occurrence of the current one, which
    only attention can find: the loss falls from log(vocab) towards log(vocab) / (seq / period) as the
    model learns it."""
    gen = torch.Generator().manual_seed(seed)
    repeats = -(-(cfg["seq"] + 1) // cfg["period"])
    for _ in range(cfg["steps"] if count is None else count):
        block = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["period"]), generator=gen)
        ids = block.repeat(1, repeats)[:, : cfg["seq"] + 1]
        # Noise: a share of the tokens replaced by random ones, which no model predicts: the loss has a
        # floor above zero, which both runs approach, so that their ratio is a steady measure.
        noisy = torch.rand(ids.shape, generator=gen) < cfg["noise"]
        ids = torch.where(noisy, torch.randint(0, cfg["vocab"], ids.shape, generator=gen), ids)
        yield ids.to(device)


def _loss(model, ids, vocab: int):
    logits = model(ids[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, vocab), ids[:, 1:].reshape(-1))


def train(cfg: dict, attention, device, seed: int, backward=None) -> dict:
    """One run from seed's weights; ``backward``: the name of sageattn's backward to train with (None:
    the device's default order)."""
    with autograd.backward_order(backward):
        return _train(cfg, attention, device, seed)


def _train(cfg: dict, attention, device, seed: int) -> dict:
    torch.manual_seed(seed)
    model = TinyLM(cfg, attention).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.0)
    steps, warmup = cfg["steps"], max(1, cfg["steps"] // 10)
    # Linear warmup, then a linear decay to a tenth: the last steps settle rather than jump.
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * max(0.1, 1.0 - s / steps)
    )
    losses, start = [], time.perf_counter()
    for ids in batches(cfg, device, seed + 1):
        loss = _loss(model, ids, cfg["vocab"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if not math.isfinite(losses[-1]):
            break
    losses = [round(x, 5) for x in losses]
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    # The final loss: the trained model on held-out batches, the same for both runs (a training step's
    # loss is one batch's and varies by several percent from step to step).
    model.eval()
    with torch.no_grad():
        held_out = [
            float(_loss(model, ids, cfg["vocab"])) for ids in batches(cfg, device, 1000, cfg["eval_batches"])
        ]
    return {"losses": losses, "seconds": seconds, "eval_loss": sum(held_out) / len(held_out)}


#: sageattn's runs by the backward they train with (None: the device's default, high precision), and the
#: issue's bar for each: the mean final loss within 1% of SDPA's, 3% with the quantized backward.
VARIANTS = {"sageattn": (None, 0.01), "sageattn int8": ("int8", 0.03)}


def summary(runs: list[dict], variants=tuple(VARIANTS)) -> dict:
    """The report's verdict over runs of several seeds (each {"seed", "sdpa", and one entry per variant}):
    the final losses averaged over the seeds, each variant's ratio to SDPA's, and each seed's. One seed's
    ratio moves by a percent or two with the training's path (two runs differ in rounding from the first
    step on, and where a model learns the task fastest shifts): the bar is held by the mean.
    ``final_loss_ratio`` is the default backward's."""
    for run in runs:
        run["ratio"] = {v: run[v]["eval_loss"] / run["sdpa"]["eval_loss"] for v in variants}
    final = {k: sum(run[k]["eval_loss"] for run in runs) / len(runs) for k in ("sdpa", *variants)}
    ratios = {v: final[v] / final["sdpa"] for v in variants}
    return {
        "final_loss": final,
        "final_loss_ratio": ratios["sageattn"],
        "final_loss_ratios": ratios,
        "per_seed_ratio": {v: {str(run["seed"]): run["ratio"][v] for run in runs} for v in variants},
        "within_bar": {v: abs(ratios[v] - 1) <= VARIANTS[v][1] for v in variants},
    }


def plot(report: dict, path: Path) -> bool:
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5))
    styles = ("--", ":", "-.")
    for i, run in enumerate(report["runs"]):
        color = f"C{i}"
        ax.plot(run["sdpa"]["losses"], color=color, linewidth=0.8, label=f"seed {run['seed']}: SDPA")
        for style, (variant, ratio) in zip(styles, run["ratio"].items()):
            ax.plot(run[variant]["losses"], color=color, linewidth=0.8, linestyle=style,
                    label=f"seed {run['seed']}: {variant} (final loss ratio {ratio:.4f})")  # fmt: skip
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    ratios = ", ".join(f"{v} {r:.4f}" for v, r in report["final_loss_ratios"].items())
    ax.set_title(
        f"fine-tuning parity, {report['device']}: mean final loss ratio to SDPA: {ratios}", fontsize=9
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def _backward_name(probe, backward) -> str:
    try:
        with autograd.backward_order(backward):
            return autograd.backward_for(probe, probe, is_causal=True)
    except RuntimeError:  # e.g. the quantized backward on a CPU, where sageattn runs SDPA anyway
        return "n/a"


def compact_json(report: dict) -> str:
    """The report as JSON, indented, with each list of numbers (the loss curves) on one line."""
    text = json.dumps(report, indent=1)
    return (
        re.sub(
            r"\[\n\s+([^\[\]{}]*?)\n\s+\]", lambda m: "[" + re.sub(r",\n\s+", ", ", m.group(1)) + "]", text
        )
        + "\n"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few steps (CPU)")
    parser.add_argument("--steps", type=int, help="training steps (default 600; smoke 30)")
    parser.add_argument("--seed", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--seeds", type=int, default=3, help="how many seeds, from --seed on (default 3)")
    parser.add_argument(
        "--out", type=Path, help="JSON report (default bench/results/finetune-parity-<gpu>-<date>.json)"
    )
    parser.add_argument("--png", type=Path, help="loss-curve plot (default: next to --out)")
    parser.add_argument("--lr", type=float, help="peak learning rate (default 1e-3; smoke 3e-3)")
    parser.add_argument("--variants", nargs="+", choices=tuple(VARIANTS), default=tuple(VARIANTS),
                        help="sageattn's runs, by backward (default: all)")  # fmt: skip
    args = parser.parse_args(argv)
    cfg = dict(SMOKE if args.smoke else FULL)
    if args.steps:
        cfg["steps"] = args.steps
    if args.lr:
        cfg["lr"] = args.lr
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    date = datetime.date.today().isoformat()
    out = args.out or Path("bench/results") / f"finetune-parity-{name.replace(' ', '_')}-{date}.json"
    png = args.png or out.with_suffix(".png")
    warnings.simplefilter("ignore", sa.SageAttentionFallbackWarning)  # on a CPU sageattn runs SDPA
    heads_dim = cfg["d_model"] // cfg["heads"]
    probe = torch.empty(1, cfg["heads"], cfg["seq"], heads_dim, device=device, dtype=ATTN_DTYPE)
    runs = [
        {
            "seed": seed,
            "sdpa": train(cfg, sdpa_attention, device, seed),
            **{v: train(cfg, sage_attention, device, seed, VARIANTS[v][0]) for v in args.variants},
        }  # fmt: skip
        for seed in range(args.seed, args.seed + args.seeds)
    ]
    report = {
        "device": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": date,
        "config": cfg,
        "steps": cfg["steps"],
        "backward": {v: _backward_name(probe, VARIANTS[v][0]) for v in args.variants},
        **summary(runs, args.variants),
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(compact_json(report))
    plotted = plot(report, png)
    final = report["final_loss"]
    print(
        f"{name}: final loss over {len(runs)} seeds: " + ", ".join(f"{k} {x:.4f}" for k, x in final.items())
    )
    for v, ratio in report["final_loss_ratios"].items():
        seeds = ", ".join(f"{r:.4f}" for r in report["per_seed_ratio"][v].values())
        print(f"  {v} (backward {report['backward'][v]}): ratio {ratio:.4f} (per seed: {seeds})")
    print(f"wrote {out}{' and ' + str(png) if plotted else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
