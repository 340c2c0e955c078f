"""The order in which the sm_90a attention's persistent CTAs draw their work items, checked on the host.

The CTAs draw items from a counter; the producer turns an item into a tile (``causal_tile``,
``light_last_tile``) and a tile into whole work or one part of a split tile (``Work``), and the consumers
decode the tile as they get it. ``tests/unit/sm90_tile_order.cu`` includes the kernel's source, plans each
launch as the bindings and the launcher do (``attn_sm90_split_plan``, ``plan_tile_order``) and decodes
every item: every tile comes out exactly once whole or as all of its parts in key order, and, non-causal,
each head's light last row block (fewer rows than a tile holds) comes after every other tile when the
launch splits no tile, ends on a partial wave the light row blocks can fill half of at least, and its K
and Vᵀ are small enough to stay in L2 (``light_heads``). Compiling takes about 15 s;
skipped without an nvcc that can target sm_90a.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.cuda_toolchain import host_check_program

SOURCE = Path(__file__).with_name("sm90_tile_order.cu")

# batch, heads_q, heads_kv, nq, nk, head_dim, causal, SMs; then the light_heads the launch must plan
SHAPES = [
    ((4, 32, 32, 1024, 1024, 128, 0, 132), 128),  # 6 row blocks a head, the last of 64 rows
    ((4, 32, 32, 1000, 1000, 128, 0, 114), 128),
    ((2, 40, 8, 1000, 1000, 128, 0, 132), 80),  # GQA, as test_persistent_ctas_take_every_tile_once
    ((2, 40, 8, 1000, 1000, 64, 0, 132), 80),
    ((1, 8, 8, 4096, 4096, 128, 0, 132), 0),  # the last wave split: the split evens it out
    ((2, 10, 10, 4096, 4096, 128, 0, 132), 0),  # SDXL-like, split too
    ((2, 10, 10, 2048, 2048, 128, 0, 132), 0),  # 20 light row blocks for a last wave of 88 tiles
    ((1, 24, 24, 4096, 4096, 128, 0, 132), 0),  # four whole waves
    ((4, 32, 32, 4096, 4096, 128, 0, 132), 0),  # K and Vᵀ too large for L2
    ((4, 32, 32, 2048, 2048, 128, 0, 132), 0),
    ((1, 24, 24, 4608, 4608, 128, 0, 132), 0),  # 192 divides n: no light row block
    ((4, 32, 32, 1024, 1024, 64, 0, 132), 0),  # 256 divides n
    ((1, 2, 2, 2100, 2100, 128, 0, 132), 0),  # every tile split
    ((1, 1, 1, 17, 17, 128, 0, 132), 0),  # one row block
    ((3, 6, 3, 113, 4095, 128, 0, 132), 0),
    ((1, 4, 4, 4095, 113, 128, 0, 132), 0),  # one wave
    ((1, 4, 4, 4095, 113, 128, 0, 84), 4),  # a last wave of 4 tiles
    ((2, 4, 2, 1, 65537, 128, 0, 132), 0),
    ((4, 32, 32, 1024, 1024, 128, 1, 132), 0),  # causal: causal_tile's order
    ((4, 32, 32, 4096, 4096, 128, 1, 132), 0),
    ((2, 40, 8, 1000, 1000, 64, 1, 132), 0),
]


@pytest.fixture(scope="module")
def order_program(tmp_path_factory):
    return host_check_program(tmp_path_factory.mktemp("sm90_tiles"), SOURCE)


def test_every_tile_once_and_light_row_blocks_last(order_program):
    args = [" ".join(str(x) for x in shape) for shape, _ in SHAPES]
    proc = subprocess.run([str(order_program), *args], capture_output=True, text=True, timeout=120)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(lines) == len(SHAPES) and all(": ok: " in line for line in lines), proc.stdout
    for (shape, light_heads), line in zip(SHAPES, lines):
        got = int(re.search(r"light_heads=(\d+)", line).group(1))
        assert got == light_heads, f"{shape}: {line}"
    # Causal launches order their last heads instead.
    assert all("causal_tail_heads=0" not in line for line in lines if "causal=1" in line)
