"""The fused sm_90a quantization's work items (csrc/fused/quant_qkv.cu), checked on the host without a GPU.

Each CTA of the quantization decodes its item from its blockIdx.x (``item_of``), and the items that need
a (b, hkv) head's statistics wait on a counter for that head's stats items. The kernel cannot deadlock
because those stats items always have lower indices: the GPU starts a grid's CTAs in increasing
blockIdx.x. ``tests/unit/quant_qkv_items.cu`` includes the kernel's source, plans the grid of each shape
as the launcher does (``plan_grid``) and decodes every item as the CTAs do. It checks that every stats
item, V tile, K block and Q tile appears exactly once, that every waiting item (V tiles, K blocks, and Q
tiles with the LSE correction) comes after all of its head's stats items, and that a call in two
launches has only stats items in the first.

The shapes cover one launch with head groups (short and long sequences, the diffusion shape), two
launches (n=32768), GQA, the awkward sizes and head dims that are not 64 or 128. Compiling takes about
10 s; skipped without an nvcc that can target sm_90a.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cuda_toolchain import host_check_program

SOURCE = Path(__file__).with_name("quant_qkv_items.cu")

# batch, heads_q, heads_kv, nq, nk, head_dim, LSE correction
SHAPES = [
    (4, 32, 32, 1024, 1024, 128, 0),
    (4, 32, 32, 4096, 4096, 128, 1),
    (4, 32, 32, 16384, 16384, 128, 0),
    (4, 32, 32, 32768, 32768, 128, 0),  # two launches
    (1, 24, 24, 4608, 4608, 128, 0),  # the diffusion shape
    (1, 24, 24, 4608, 4608, 128, 1),
    (2, 32, 8, 8192, 8192, 64, 1),  # GQA
    (2, 8, 2, 1000, 999, 64, 1),
    (1, 1, 1, 1, 1, 8, 0),
    (1, 2, 1, 17, 17, 72, 1),
    (3, 6, 3, 113, 4095, 120, 1),
    (1, 4, 4, 4095, 113, 128, 0),
    (1, 2, 1, 0, 113, 128, 0),  # no queries
    (2, 4, 2, 1, 65537, 128, 1),  # one query against long K/V
    (1, 64, 64, 2048, 2048, 32, 0),
]


@pytest.fixture(scope="module")
def items_program(tmp_path_factory):
    return host_check_program(tmp_path_factory.mktemp("quant_items"), SOURCE)


def test_every_item_once_and_waits_only_for_earlier_items(items_program):
    args = [" ".join(str(x) for x in shape) for shape in SHAPES]
    proc = subprocess.run([str(items_program), *args], capture_output=True, text=True, timeout=120)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(lines) == len(SHAPES) and all(": ok: " in line for line in lines), proc.stdout
    # Both ways of launching are covered.
    assert any("one launch" in line for line in lines) and any("two launches" in line for line in lines)
