"""Where the sm_90a kernel's warps wait, from an Nsight Compute source page: the warp-stall samples of
the steady-state key loop by opcode, and the stall reasons of the loop and of the whole kernel.

    ncu --kernel-name regex:attn --launch-skip 45 --launch-count 1 --clock-control none \\
        --section WarpStateStats --section SourceCounters -o sm90 bench-binary ...
    ncu -i sm90.ncu-rep --page source --csv --print-source sass > source.csv
    python bench/ncu_loop.py source.csv

The key loop is the one tests/unit/test_cuda_compile_sm90.py checks (``key_loop``: the shortest span
from a backward branch's target to the branch that holds a block's softmax).
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.unit.test_cuda_compile_sm90 import key_loop  # noqa: E402

SAMPLES = "Warp Stall Sampling (All Samples)"


def read_source(path: Path) -> tuple[list[tuple[int, str]], dict[int, dict[str, int]]]:
    """The SASS lines (address, text) and each line's sample counts by column."""
    rows = list(csv.reader(path.open()))
    header = next(r for r in rows if r and r[0] == "Address")
    counted = [h for h in header if h == SAMPLES or (h.startswith("stall_") and "Not Issued" not in h)]
    columns = {h: header.index(h) for h in counted}  # once, not per row
    code, counts = [], {}
    for row in rows:
        if not row or not row[0].startswith("0x"):
            continue
        address = int(row[0], 16)
        code.append((address, row[1].strip()))
        counts[address] = {h: int(row[i] or 0) for h, i in columns.items()}
    return code, counts


def opcode(text: str) -> str:
    """The opcode without its predicate and rounding suffixes (FFMA.FTZ -> FFMA)."""
    op = re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]
    return re.sub(r"\.(FTZ|RZ|RN|RM|RP)$", "", op)


def reasons(lines: list[tuple[int, str]], counts: dict[int, dict[str, int]]) -> str:
    total = collections.Counter()
    for address, _ in lines:
        total.update({h: v for h, v in counts[address].items() if h.startswith("stall_")})
    whole = sum(total.values()) or 1
    return ", ".join(f"{h[6:]} {100 * v / whole:.1f}%" for h, v in total.most_common() if v / whole > 0.01)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source_csv", type=Path)
    ap.add_argument("--top", type=int, default=16, help="opcodes listed")
    args = ap.parse_args(argv)
    code, counts = read_source(args.source_csv)
    loop = key_loop(code)
    total = sum(c[SAMPLES] for c in counts.values())
    in_loop = sum(counts[a][SAMPLES] for a, _ in loop) or 1
    share = 100 * in_loop / (total or 1)
    print(f"all samples {total}; steady key loop ({len(loop)} SASS instructions) {in_loop} ({share:.1f}%)")
    by_op = collections.defaultdict(lambda: [0, 0])
    for address, text in loop:
        entry = by_op[opcode(text)]
        entry[0] += 1
        entry[1] += counts[address][SAMPLES]
    print(f"{'opcode':48s} {'count':>5s} {'samples':>8s} {'share':>6s} {'per instr':>9s}")
    for op, (n, s) in sorted(by_op.items(), key=lambda kv: -kv[1][1])[: args.top]:
        print(f"{op:48s} {n:5d} {s:8d} {100 * s / in_loop:5.1f}% {s / n:9.0f}")
    print(f"stall reasons (loop): {reasons(loop, counts)}")
    print(f"stall reasons (kernel): {reasons(code, counts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
