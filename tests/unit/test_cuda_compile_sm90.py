"""The sm_90a CUDA kernel (csrc/sm90) compiles with nvcc for sm_90a without a GPU, and its Vᵀ key
permutation is consistent with the wgmma fragment layouts it is derived from.

Compile checks (skipped without nvcc, or with an nvcc that cannot target sm_90a):

* ``-Xptxas -v``: no stack frame beyond a few spilled registers (at most MAX_SPILL_BYTES, outside the
  key loop, see below), the registers per thread that ``__launch_bounds__`` leaves (65536 / threads,
  rounded down to 8: 128 for the 512 threads of a head-dim-128 CTA, 96 for the 640 of a head-dim-64
  one; ptxas reports that launch figure, while the consumer code after ``setmaxnreg.inc`` may use up
  to 160 or 112), no ptxas warning, and no "Potential Performance Loss" note: ptxas reports a wgmma
  it had to serialize (C7513, e.g. a register of an in-flight wgmma written by another instruction)
  as "info", not as a warning.
* The PTX holds the instructions the kernel is built around: the INT8 and FP8 wgmma shapes,
  wgmma fence/commit/wait, 4-d TMA tile loads completing on mbarriers and the output's TMA stores,
  setmaxnreg, the named barrier of each warpgroup's output tile, ex2.approx, and exp2_h2's f16x2
  arithmetic.
* When a cuobjdump is found (next to nvcc, on PATH, or inside the triton package), the SASS holds
  the Hopper tensor-core instructions: IGMMA (INT8) and QGMMA (FP8) warpgroup MMAs, UTMALDG and
  UTMASTG (TMA), USETMAXREG; and, per kernel: no register above the consumers' budget; no spill
  store in the key loop; wgmmas issued in groups, one wait per group; no instruction writing a
  register of an in-flight wgmma or reading its accumulator (a data-flow pass over the SASS
  control-flow graph); the scores converted as planned; the exp2 of two column tiles in f16x2 in the
  non-causal head-dim-128 kernels; at head dim 128 the tile decoded again under
  the last block's Q·Kᵀ, at 64 before it; the output tile's named barrier and no other; the output
  stored by TMA (UTMASTG), no STG but the LSE's; the key loops ptxas scheduled, as
  csrc/sm90/key_loops.json records them (tests/sm90_sass.py; checked with the recording nvcc only).

The flags are the package's nvcc flags from build-matrix.yaml. About 20 s on 2 cores (12 kernels:
head dim 64/128 x causal x fp16/bf16 output, and the non-causal ones with key lengths).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from sageattention.reference import permute_keys_sm90
from sagebuild.key_loops import (
    EXP2_PAIR,
    GUARD,
    compare,
    exp2_count,
    key_loop,
    key_loops,
    load_record,
    sass_functions,
)
from tests.cuda_toolchain import NO_NVCC, NVCC, compile_nvcc, cuobjdump, gpu_codes, nvcc_flags
from tests.sm90_sass import ARCH, SM90_SOURCES, compile_cubin, disassemble, nvcc_release

ROOT = Path(__file__).resolve().parents[2]
# Per head dim: (registers per thread at launch, 65536 / threads in units of 8; the consumers'
# setmaxnreg.inc target), for 1 producer and 3 (head dim 128) or 4 (64) consumer warpgroups.
REGISTERS = {"128": (128, 160), "64": (96, 112)}
MAX_SPILL_BYTES = 128  # outside the key loop: a few values of the epilogue or the peeled last block

PTX_EXPECTED = [
    "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8",
    "wgmma.mma_async.sync.aligned.m64n136k32.f32.e4m3.e4m3",  # P·V and row sums at d_pad = 128
    "wgmma.mma_async.sync.aligned.m64n72k32.f32.e4m3.e4m3",  # P·V and row sums at d_pad = 64
    "wgmma.fence.sync.aligned",
    "wgmma.commit_group.sync.aligned",
    "wgmma.wait_group.sync.aligned",
    "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
    "mbarrier.try_wait.parity",
    "mbarrier.arrive.expect_tx",
    "setmaxnreg.inc.sync.aligned.u32",
    "setmaxnreg.dec.sync.aligned.u32",
    "cvt.rn.satfinite.e4m3x2.f32",
    "ex2.approx.ftz.f32",
    "cvt.rn.relu.f16x2.f32",  # exp2_h2: two scores' exp2 in f16x2 (non-causal head dim 128)
    "fma.rn.f16x2",
    "cvt.rn.satfinite.e4m3x2.f16x2",
    "bar.sync",  # each consumer warpgroup's output tile (a named barrier)
    "griddepcontrol.wait",  # programmatic launch: global accesses wait for the kernel before
    "cp.async.bulk.prefetch.tensor.4d.L2.global.tile",  # the next tile's Q into L2
    "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group",  # the output, by TMA stores
    "cp.async.bulk.wait_group.read",
]
SASS_EXPECTED = [
    "IGMMA.64x128x32.S8.S8",
    "QGMMA.64x136x32.F32.E4M3.E4M3",
    "QGMMA.64x72x32.F32.E4M3.E4M3",
    "UTMALDG.4D",
    "UTMASTG.4D",
    "USETMAXREG",
]


needs_nvcc = pytest.mark.skipif(NVCC is None, reason=NO_NVCC)


def test_there_are_sm90_kernels():
    assert SM90_SOURCES, "csrc/sm90 holds no .cu file"


@pytest.fixture(scope="module")
def sm90_builds(tmp_path_factory):
    """{source name: (ptxas log, cubin path, ptx text)}, compiled once for the module."""
    if NVCC is None:
        pytest.skip(NO_NVCC)
    if ARCH.rstrip("a") not in gpu_codes():  # --list-gpu-code names sm_90, not sm_90a
        pytest.skip(f"this nvcc cannot target {ARCH}")
    out = tmp_path_factory.mktemp("sm90")
    builds = {}
    for source in SM90_SOURCES:
        cubin, ptx = out / f"{source.stem}.cubin", out / f"{source.stem}.ptx"
        log = compile_cubin(source, cubin, "-Xptxas", "-v")
        compile_nvcc(["-ptx", f"-arch={ARCH}", *nvcc_flags(), str(source), "-o", str(ptx)])
        builds[source.name] = (log, cubin, ptx.read_text())
    return builds


@needs_nvcc
@pytest.mark.parametrize("source", [p.name for p in SM90_SOURCES])
def test_compiles_within_the_register_budget(sm90_builds, source):
    log, _, _ = sm90_builds[source]
    entries = re.findall(r"Compiling entry function '(\w+)'", log)
    assert entries, f"no kernel was compiled:\n{log}"
    usage = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    registers = re.findall(r"Used (\d+) registers", log)
    assert len(usage) == len(entries) == len(registers), log
    for name, frame, used in zip(entries, usage, registers):
        assert max(int(x) for x in frame) <= MAX_SPILL_BYTES, f"{name}: stack frame or spills {frame}"
        assert int(used) <= REGISTERS[head_dim_of(name)][0], f"{name}: {used} registers"
    warnings = [
        line for line in log.splitlines() if "warning" in line.lower() or "performance loss" in line.lower()
    ]
    assert not warnings, "ptxas warnings:\n" + "\n".join(warnings)


def head_dim_of(name: str) -> str:
    """The head dim (d_pad) of a kernel instantiation, from its mangled name."""
    found = re.search(r"kernelILi(\d+)E", name)
    assert found, f"no head dim in the kernel name {name}"
    return found.group(1)


@needs_nvcc
@pytest.mark.parametrize("source", [p.name for p in SM90_SOURCES])
def test_ptx_uses_the_intended_instructions(sm90_builds, source):
    _, _, ptx = sm90_builds[source]
    missing = [s for s in PTX_EXPECTED if s not in ptx]
    assert not missing, f"{source}: PTX lacks {missing}"


@needs_nvcc
@pytest.mark.parametrize("source", [p.name for p in SM90_SOURCES])
def test_sass_uses_hopper_tensor_cores(sm90_sass, source):
    missing = [s for s in SASS_EXPECTED if s not in sm90_sass[source]]
    assert not missing, f"{source}: SASS for {ARCH} lacks {missing}"


# --------------------------------------------------------------------------------------------------
# The wgmma pipeline in the SASS: what ptxas made of the kernel.

# Opcodes whose first register operand is not written (stores, barriers, control, uniform-only).
NO_REGISTER_DEST = (
    "ST", "RED", "ATOM", "BAR", "BRA", "EXIT", "SYNCS", "WARPGROUP", "UTMA", "MEMBAR", "NOP", "WARPSYNC",
    "ISETP", "FSETP", "PLOP3", "USETMAXREG", "R2UR", "U", "DEPBAR", "FENCE", "CCTL", "BSSY", "BSYNC",
)  # fmt: skip


@pytest.fixture(scope="module")
def sm90_sass(sm90_builds):
    """{source name: SASS text}."""
    tool = cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump found (CUDA toolkit, PATH or the triton package)")
    return {source: disassemble(tool, cubin) for source, (_, cubin, _) in sm90_builds.items()}


def _split(text: str) -> tuple[str, list[str]]:
    """(opcode, operands) of one instruction, its guard predicate (@P0) dropped."""
    text = GUARD.sub("", text)
    opcode, _, rest = text.partition(" ")
    operands, depth, current = [], 0, ""
    for ch in rest:
        depth += ch in "[{("
        depth -= ch in "]})"
        if ch == "," and depth == 0:
            operands.append(current.strip())
            current = ""
        else:
            current += ch
    if current.strip():
        operands.append(current.strip())
    return opcode, operands


def _registers(operand: str, width: int = 1) -> set[int]:
    """General registers an operand names: R7 -> {7}; R6.64 or a width of 2 -> {6, 7}."""
    found = set()
    for m in re.finditer(r"\bR(\d+)(\.64|\.128)?", operand):
        w = max(width, {".64": 2, ".128": 4}.get(m.group(2), 1))
        found |= set(range(int(m.group(1)), int(m.group(1)) + w))
    return found


def _successors(code: list[tuple[int, str]]) -> list[list[int]]:
    index = {address: i for i, (address, _) in enumerate(code)}
    successors = []
    for i, (_, text) in enumerate(code):
        guarded = text.startswith("@")
        opcode, operands = _split(text)
        nexts = []
        if opcode.startswith("BRA"):
            target = re.search(r"0x([0-9a-f]+)", " ".join(operands))
            if target and int(target.group(1), 16) in index:
                nexts.append(index[int(target.group(1), 16)])
            if guarded or opcode != "BRA":  # BRA.DIV, BRA.U.ANY, @P BRA: may fall through
                nexts.append(i + 1)
        elif not opcode.startswith(("EXIT", "RET")) or guarded:
            nexts.append(i + 1)
        successors.append([n for n in nexts if n < len(code)])
    return successors


def wgmma_hazards(code: list[tuple[int, str]]) -> list[str]:
    """Instructions that touch a register of a wgmma still in flight: writes to its accumulator or
    A registers, reads of its accumulator. A forward data-flow pass over the control-flow graph; the
    state is the in-flight wgmma groups (accumulator and A registers), oldest first: a GMMA with
    gsb0 closes its group (commit), WARPGROUP.DEPBAR.LE gsb0, N keeps the N newest. Paths join by
    union, aligned on the newest group."""
    empty: frozenset[int] = frozenset()
    successors = _successors(code)
    states: list = [None] * len(code)
    states[0] = ((empty, empty), ())
    work, hazards = [0], set()

    def join(x, y):
        if x is None or x == y:
            return y
        n = max(len(x[1]), len(y[1]))
        px = ((empty, empty),) * (n - len(x[1])) + x[1]
        py = ((empty, empty),) * (n - len(y[1])) + y[1]
        pending = tuple((a[0] | b[0], a[1] | b[1]) for a, b in zip(px, py))
        return ((x[0][0] | y[0][0], x[0][1] | y[0][1]), pending)

    while work:
        i = work.pop()
        (open_acc, open_a), pending = states[i]
        address, text = code[i]
        opcode, operands = _split(text)
        acc_in_flight = set(open_acc).union(*(g[0] for g in pending))
        a_in_flight = set(open_a).union(*(g[1] for g in pending))
        if "GMMA" in opcode:
            n = int(re.search(r"\.64x(\d+)x", opcode).group(1))
            acc = _registers(operands[0], n // 2)
            a = _registers(operands[1], 4) if operands[1].startswith("R") else set()
            if a & acc_in_flight:
                hazards.add(f"{address:05x} {text}: A operand in an in-flight accumulator")
            opened = (open_acc | acc, open_a | a)
            state = ((empty, empty), pending + (opened,)) if "gsb0" in text else (opened, pending)
        elif opcode.startswith("WARPGROUP.DEPBAR"):
            keep = int(re.search(r"0x([0-9a-f]+)", text).group(1), 16)
            state = ((open_acc, open_a), pending[len(pending) - keep :] if keep else ())
        else:
            dest, sources = set(), operands
            if opcode.startswith("SHFL"):  # SHFL.BFLY PT, R1, R2, ...: predicate and register out
                dest, sources = _registers(operands[1]), operands[2:]
            elif operands and operands[0].startswith("R") and not opcode.startswith(NO_REGISTER_DEST):
                width = 2 if (".64" in opcode or "WIDE" in opcode or opcode.startswith("CS2R")) else 1
                dest, sources = _registers(operands[0], 4 if ".128" in opcode else width), operands[1:]
            written = dest & (acc_in_flight | a_in_flight)
            if written:
                hazards.add(f"{address:05x} {text}: writes in-flight wgmma registers {sorted(written)}")
            read = set().union(*(_registers(o) for o in sources)) & acc_in_flight if sources else set()
            if read:
                hazards.add(f"{address:05x} {text}: reads in-flight accumulators {sorted(read)}")
            state = states[i]
        for j in successors[i]:
            joined = join(states[j], state)
            if joined != states[j]:
                states[j] = joined
                work.append(j)
    return sorted(hazards)


def _kernels(sm90_sass, source):
    functions = sass_functions(sm90_sass[source])
    assert functions, f"{source}: no kernel in the SASS"
    return functions


@needs_nvcc
@pytest.mark.parametrize("source", [p.name for p in SM90_SOURCES])
def test_sass_registers_fit_the_consumer_budget(sm90_sass, source):
    for name, code in _kernels(sm90_sass, source).items():
        top = max(r for _, text in code for r in _registers(text))
        assert top < REGISTERS[head_dim_of(name)][1], f"{name} uses R{top}"


@needs_nvcc
@pytest.mark.parametrize("source", [p.name for p in SM90_SOURCES])
def test_sass_key_loop_spills_nothing(sm90_sass, source):
    """What little ptxas spills at the consumers' budget (test_compiles_within_the_register_budget) it
    spills outside the key loop: no spill store per block, at most one reload of a value spilled
    before the loop."""
    for name, code in _kernels(sm90_sass, source).items():
        loop = key_loop(code)
        stores = [text for _, text in loop if text.startswith("STL")]
        loads = [text for _, text in loop if text.startswith("LDL")]
        assert not stores and len(loads) <= 1, f"{name}: key loop of {len(loop)} holds {stores + loads}"


@needs_nvcc
@pytest.mark.parametrize("source", [p.name for p in SM90_SOURCES])
def test_sass_wgmmas_are_issued_in_groups(sm90_sass, source):
    """A serialized wgmma (C7513) shows as one WARPGROUP.DEPBAR per GMMA; the kernels wait once per
    group of 2 to 4 wgmmas (2 waits per block: Q·Kᵀ, then P·V)."""
    for name, code in _kernels(sm90_sass, source).items():
        gmma = sum("GMMA" in text for _, text in code)
        waits = sum("WARPGROUP.DEPBAR" in text for _, text in code)
        assert gmma and waits * 2 < gmma, f"{name}: {waits} wgmma waits for {gmma} wgmmas"


@needs_nvcc
@pytest.mark.parametrize("source", [p.name for p in SM90_SOURCES])
def test_sass_leaves_in_flight_wgmma_registers_alone(sm90_sass, source):
    for name, code in _kernels(sm90_sass, source).items():
        hazards = wgmma_hazards(code)
        assert not hazards, f"{name}:\n" + "\n".join(hazards[:20])


@needs_nvcc
@pytest.mark.parametrize("source", [p.name for p in SM90_SOURCES])
def test_sass_hazard_check_sees_a_planted_hazard(sm90_sass, source):
    """The data-flow pass is not vacuous: an instruction planted right after a P·V wgmma group is
    issued, writing or reading its accumulator, is reported."""
    for name, code in _kernels(sm90_sass, source).items():
        last_pv = max(i for i, (_, text) in enumerate(code) if "QGMMA" in text and "gsb0" in text)
        accumulator = int(re.search(r"QGMMA\S* R(\d+)", code[last_pv][1]).group(1))
        for planted, report in (
            (f"FADD.FTZ R{accumulator + 3}, R0, R1", "writes in-flight"),
            (f"FADD.FTZ R0, R{accumulator + 5}, R1", "reads in-flight"),
        ):
            patched = code[: last_pv + 1] + [(code[last_pv][0] + 1, planted)] + code[last_pv + 1 :]
            assert any(report in h for h in wgmma_hazards(patched)), f"{name}: {planted} not reported"


@needs_nvcc
@pytest.mark.parametrize("source", [p.name for p in SM90_SOURCES])
def test_sass_waits_for_every_wgmma_group(sm90_sass, source):
    """A consumer warpgroup has one wgmma group in flight at a time (its Q·Kᵀ or its P·V): every wait
    is for all groups (WARPGROUP.DEPBAR.LE gsb0, 0x0), none leaves one in flight."""
    for name, code in _kernels(sm90_sass, source).items():
        partial = [text for _, text in code if "WARPGROUP.DEPBAR" in text and "gsb0, 0x0" not in text]
        assert not partial, f"{name}: partial wgmma waits {partial[:3]}"


@needs_nvcc
@pytest.mark.parametrize("source", [p.name for p in SM90_SOURCES])
def test_sass_score_conversion_by_kernel(sm90_sass, source):
    """The unmasked softmax turns its INT32 scores into floats by an integer add of 1.5 * 2^23's bit
    pattern at head dim 64 (64 VIADD per softmax copy; non-causal 4-7% faster), by I2FP at head dim
    128 (where the two measured the same). Each kernel holds one or two unmasked copies of the softmax
    (64 scores each) and one masked one, which converts by I2FP."""
    for name, code in _kernels(sm90_sass, source).items():
        head_dim = head_dim_of(name)
        adds = sum(bool(re.match(r"VIADD R\d+, R\d+, 0x4b400000$", text)) for _, text in code)
        i2fp = sum(text.startswith("I2FP.F32.S32") for _, text in code)
        copies = exp2_count(code) // 66  # 64 scores and 2 rescales
        assert copies >= 2, f"{name}: {copies} softmax copies"
        if head_dim == "64":
            assert adds == 64 * copies // 2 and i2fp <= 66 * copies // 2, f"{name}: {adds} adds, {i2fp} I2FP"
        else:
            assert adds == 0 and i2fp >= 64 * copies, f"{name}: {adds} adds, {i2fp} I2FP"


@needs_nvcc
@pytest.mark.parametrize("source", [p.name for p in SM90_SOURCES])
def test_sass_tile_decoded_under_the_last_qk_at_head_dim_128(sm90_sass, source):
    """The tile's last block and epilogue need it decoded again (integer divisions by the launch's
    row blocks, heads and split parts). At head dim 128 that runs between the last block's Q·Kᵀ issue
    and its wait, under the wgmma (0.4-0.9% faster at n <= 2048); at 64 before the block, where the
    other placement moved ptxas's key loop and cost 1.6% (bench/NOTES.md, run l). The instructions
    between the kernel's last INT8 wgmma group and its wait: dozens with a division step (I2F.RP and
    MUFU.RCP, or IMAD.HI) at head dim 128; a few, none of them a division step, at 64."""
    division = ("I2F.U32.RP", "I2F.RP", "MUFU.RCP", "IMAD.HI")
    for name, code in _kernels(sm90_sass, source).items():
        last_qk = max(i for i, (_, text) in enumerate(code) if text.startswith("IGMMA") and "gsb0" in text)
        wait = next(i for i in range(last_qk, len(code)) if "WARPGROUP.DEPBAR" in code[i][1])
        under = [text for _, text in code[last_qk + 1 : wait]]
        divides = [text for text in under if text.startswith(division)]
        if head_dim_of(name) == "128":
            assert len(under) >= 30 and divides, f"{name}: {len(under)} instructions under the last Q·Kᵀ"
        else:
            assert len(under) <= 16 and not divides, f"{name}: {under}"


@needs_nvcc
@pytest.mark.parametrize("source", [p.name for p in SM90_SOURCES])
def test_sass_one_named_barrier_and_output_by_tma(sm90_sass, source):
    """The only named barrier is the one of a warpgroup's output tile, a BAR.SYNC at two points of a
    tile's epilogue: before the tile is written (the previous tile's TMA stores have read it) and
    before its TMA store; the non-causal kernels, whose split tiles' parts count themselves on their
    tile's counter (merge_parts), sync on it at two more points. The output leaves by TMA (UTMASTG), so
    the only global stores (STG) are the LSE's, one per row of a thread, and in the non-causal kernels
    a part's partials: d_pad / 2 output values, two maxima and two row sums per thread."""
    for name, code in _kernels(sm90_sass, source).items():
        d_pad, causal = (int(x) for x in re.search(r"kernelILi(\d+)ELb(\d)E", name).groups())
        named = [text for _, text in code if re.match(r"BAR\.(ARV|SYNC)\S* R\d+", text)]
        syncs = all(t.startswith("BAR.SYNC") for t in named)
        assert len(named) == (2 if causal else 4) and syncs, f"{name}: named barriers {named}"
        if causal:
            assert len({t.split()[1] for t in named}) == 1, f"{name}: two named barriers {named}"
        stores = [text for _, text in code if text.startswith("STG")]
        if causal:
            assert len(stores) <= 2, f"{name}: {len(stores)} global stores: {stores[:3]}"
        else:  # the LSE's and every partial value of a split tile's part, each stored once
            assert len(stores) == 2 + d_pad // 2 + 4, f"{name}: {len(stores)} global stores: {stores[:3]}"


@needs_nvcc
@pytest.mark.parametrize("source", [p.name for p in SM90_SOURCES])
def test_sass_whole_last_block_takes_the_unmasked_softmax(sm90_sass, source):
    """At head dim 128 a non-causal last block that lies wholly below Nk skips the mask (run m:
    1.5-4% faster): those kernels inline the block's softmax three times (the key loop's, the masked
    last block's, the unmasked last block's: 64 exp2 each, on either path, and 2 for the rescale); the
    causal and the head-dim-64 ones twice."""
    for name, code in _kernels(sm90_sass, source).items():
        exp2 = exp2_count(code)
        softmaxes = 3 if re.search(r"kernelILi128ELb0E", name) else 2
        assert softmaxes * 66 <= exp2 < (softmaxes + 1) * 64, f"{name}: {exp2} exp2"


@needs_nvcc
@pytest.mark.parametrize("source", [p.name for p in SM90_SOURCES])
def test_sass_exp2_in_half_precision_by_kernel(sm90_sass, source):
    """The non-causal head-dim-128 kernels take the exp2 of two of a block's 16 column tiles (7 and 11:
    8 of a thread's 64 scores) in f16x2 on the FMA and ALU pipes (exp2_h2; 1.3-2.7% faster, run ab),
    in both of their unmasked softmaxes: the key loop holds 56 + 2 MUFU.EX2 and 4 f16x2 pairs, each
    packed to e4m3 from f16x2. The masked softmax and the other kernels keep MUFU.EX2 for all 64."""
    for name, code in _kernels(sm90_sass, source).items():
        loop = key_loop(code)
        mufu = sum("MUFU.EX2" in text for _, text in loop)
        pairs = sum(EXP2_PAIR in text for _, text in loop)
        packs = sum(text.startswith("F2FP.SATFINITE.E4M3.F16") for _, text in loop)
        whole = sum(EXP2_PAIR in text for _, text in code)
        if head_dim_of(name) == "128" and not re.search(r"kernelILi\d+ELb1E", name):
            assert (mufu, pairs, packs, whole) == (58, 4, 4, 8), f"{name}: {mufu}, {pairs}, {packs}, {whole}"
        else:
            assert (mufu, pairs, packs, whole) == (66, 0, 0, 0), f"{name}: {mufu}, {pairs}, {packs}, {whole}"


@needs_nvcc
def test_sass_key_loops_match_the_record(sm90_sass):
    """The key loops are the ones csrc/sm90/key_loops.json records (length and opcode order, per
    kernel; tests/sm90_sass.py). ptxas schedules the loop anew after any edit of the kernel function,
    and a reordered loop has measured up to 9% slower: a change that moves a loop is measured against
    main, then recorded. Checked with the nvcc build that made the record only."""
    recorded = load_record(ROOT)
    release = nvcc_release(NVCC)
    if release != recorded["nvcc"]:
        pytest.skip(f"the key loops were recorded with nvcc {recorded['nvcc']}; this one is {release}")
    current = key_loops(sm90_sass.values())
    changed = compare(current, recorded)  # empty exactly when the labels and every loop agree
    assert set(current) == set(recorded["kernels"]) and not changed, (
        "ptxas scheduled other key loops than the recorded ones:\n  " + "\n  ".join(changed) + "\n"
        "Measure the change against main (bench/NOTES.md: lengths it does not touch too), then record the "
        "loops with: python -m tests.sm90_sass --write"
    )


def test_key_loop_record_covers_every_kernel():
    """The record names the twelve kernels: head dim 64 and 128, causal or not, bf16 or fp16 output, and
    the non-causal ones again with key lengths (kKeyLens)."""
    recorded = load_record(ROOT)
    expected = {
        f"d{d} {c} {t}" for d in (64, 128) for c in ("causal", "non-causal") for t in ("bf16", "fp16")
    } | {f"d{d} non-causal {t} key-lengths" for d in (64, 128) for t in ("bf16", "fp16")}
    assert set(recorded["kernels"]) == expected
    for loop in recorded["kernels"].values():
        assert 300 <= loop["instructions"] <= 600 and re.fullmatch(r"[0-9a-f]{64}", loop["opcodes_sha256"])


# --------------------------------------------------------------------------------------------------
# The Vᵀ key permutation against the fragment layouts (csrc/include/sage_wgmma.cuh), simulated.


def _accumulator_coord(warp: int, lane: int, i: int) -> tuple[int, int]:
    """(row, column) of register i of an m64nN FP32/S32 wgmma accumulator."""
    return 16 * warp + lane // 4 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * (lane % 4) + i % 2


def _a_operand_coord(warp: int, lane: int, reg: int, byte: int) -> tuple[int, int]:
    """(row, k) of byte `byte` of register `reg` of an 8-bit m64nNk32 wgmma A fragment."""
    return 16 * warp + lane // 4 + 8 * (reg % 2), 4 * (lane % 4) + byte + 16 * (reg // 2)


def test_permuted_keys_pair_each_p_with_its_own_v_row():
    """One 64-row warpgroup and one 128-key block, as the kernel packs it: the scores a thread holds
    in accumulator order go, unshuffled, into the A registers of the four k32 steps (column tiles
    4kk, 4kk+1 of row `group` into a[0], of row `group + 8` into a[1]; tiles 4kk+2, 4kk+3 into a[2],
    a[3]); B is the permuted Vᵀ. The products must be P @ V exactly."""
    gen = torch.Generator().manual_seed(0)
    rows, keys, channels = 64, 128, 16
    p = torch.randint(-8, 9, (rows, keys), generator=gen).double()
    v = torch.randint(-8, 9, (keys, channels), generator=gen).double()
    vt_perm = permute_keys_sm90(v.T.contiguous())  # [channels, keys], as quant_v_fp8 stores it

    a = torch.full((rows, keys), float("nan"), dtype=torch.float64)  # A as the MMA sees it
    for warp in range(4):
        for lane in range(32):
            acc = [p[_accumulator_coord(warp, lane, i)] for i in range(64)]
            for kk in range(keys // 32):
                x = acc[16 * kk : 16 * kk + 16]
                regs = [
                    (x[0], x[1], x[4], x[5]),
                    (x[2], x[3], x[6], x[7]),
                    (x[8], x[9], x[12], x[13]),
                    (x[10], x[11], x[14], x[15]),
                ]
                for reg, values in enumerate(regs):
                    for byte, value in enumerate(values):
                        row, k = _a_operand_coord(warp, lane, reg, byte)
                        assert torch.isnan(a[row, 32 * kk + k]), "an A element is written twice"
                        a[row, 32 * kk + k] = value
    assert not torch.isnan(a).any(), "an A element is never written"
    torch.testing.assert_close(a @ vt_perm.T, p @ v, rtol=0, atol=0)


def test_permutation_is_the_documented_table():
    slots = permute_keys_sm90(torch.arange(32).view(1, 32))[0].tolist()
    group = [0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15]
    assert slots == group + [16 + t for t in group]
    with pytest.raises(ValueError, match="multiple of 16"):
        permute_keys_sm90(torch.zeros(2, 20))
