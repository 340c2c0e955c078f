"""Plot a bench/results JSON: TOPS against sequence length, one panel per (head dim, causal).

python bench/plot.py bench/results/attention-NVIDIA_H200-2026-11-29ab.json
"""

from __future__ import annotations

import json
import pathlib
import sys

META_KEYS = {"b", "h", "n", "d", "causal"}


def plot_results(path: pathlib.Path) -> pathlib.Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(pathlib.Path(path).read_text())
    rows, meta = data["rows"], data["meta"]
    panels = sorted({(r["d"], r["causal"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (d, causal) in zip(axes[0], panels):
        sub = [r for r in rows if r["d"] == d and r["causal"] == causal]
        impls = sorted({k for r in sub for k in r} - META_KEYS)
        for impl in impls:
            pts = [(r["n"], r[impl]) for r in sub if impl in r]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TOPS")
        ax.set_title(f"d={d} {'causal' if causal else 'non-causal'} b={sub[0]['b']} h={sub[0]['h']}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{meta['device']}  torch {meta['torch']}  {meta['date'][:10]}")
    fig.tight_layout()
    out = pathlib.Path(path).with_suffix(".png")
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(plot_results(pathlib.Path(arg)))
