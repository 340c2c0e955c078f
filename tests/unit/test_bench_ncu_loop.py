"""bench/ncu_loop.py reads an Nsight Compute source page (CSV) and sums the key loop's warp-stall
samples by opcode and reason: checked on a small page written here."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("ncu_loop", ROOT / "bench" / "ncu_loop.py")
ncu_loop = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ncu_loop)

HEADER = [
    "Address",
    "Source",
    ncu_loop.SAMPLES,
    "# Samples",
    "stall_barrier",
    "stall_wait",
    "stall_wait (Not Issued)",
]


def write_page(path: Path) -> None:
    """A prologue line, a loop of 64 + 2 MUFU.EX2, one FFMA and a wgmma wait closed by a backward
    branch, and an epilogue line; samples: MUFU 10 each (wait), the wait 300 (barrier), FFMA 20."""
    base = 0x1000
    lines = [("MOV R1, R2", 5, 0, 5)]
    lines += [(f"MUFU.EX2 R{i}, R{i}", 10, 0, 10) for i in range(66)]
    lines += [("FFMA.FTZ R3, R4, R5, R6", 20, 0, 20), ("WARPGROUP.DEPBAR.LE gsb0, 0x0", 300, 300, 0)]
    loop_start = base + 0x10
    lines += [(f"@!P0 BRA {loop_start:#x}", 0, 0, 0), ("EXIT", 1, 0, 1)]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "attn_int8_fp8_sm90_kernel"])
        w.writerow(HEADER)
        for i, (text, samples, barrier, wait) in enumerate(lines):
            w.writerow([f"{base + 0x10 * i:#x}", f"      {text}", samples, samples, barrier, wait, 0])


def test_key_loop_samples_by_opcode_and_reason(tmp_path, capsys):
    page = tmp_path / "source.csv"
    write_page(page)
    assert ncu_loop.main([str(page)]) == 0
    out = capsys.readouterr().out
    # 660 + 20 + 300 samples in the loop of 69 instructions, 986 in all.
    assert "steady key loop (69 SASS instructions) 980 (99.4%)" in out
    rows = {line.split()[0]: line.split()[1:3] for line in out.splitlines()[2:5]}
    assert rows == {"MUFU.EX2": ["66", "660"], "WARPGROUP.DEPBAR.LE": ["1", "300"], "FFMA": ["1", "20"]}
    assert "stall reasons (loop): wait 69.4%, barrier 30.6%" in out
