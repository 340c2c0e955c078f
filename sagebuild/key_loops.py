"""The sm_90a attention kernels' key loops in SASS, and the record of the measured ones.

ptxas schedules the attention kernel's key loop anew whenever anything in the kernel function changes,
and also when another ptxas compiles the same PTX: across CUDA 12.6 to 13.5 the same source gave five
orders of the non-causal head-dim-128 loop, from 0.5% to 16% slower than the one CUDA 13.0 gives
(bench/NOTES.md, run y). csrc/sm90/key_loops.json therefore records, per kernel, the measured loop's
length and a digest of its opcode sequence (registers, predicates and addresses left out), with the
nvcc that compiled it. The compile tests hold the source to it (tests/sm90_sass.py), and
``sagebuild verify`` says whether a wheel's sm_90a module carries those loops.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path

#: where the record lives, relative to the sageattention package's source folder
RECORD = Path("csrc") / "sm90" / "key_loops.json"
#: the attention kernels' names, as cuobjdump prints them (mangled attn_int8_fp8_sm90_kernel<...>)
KERNEL_NAME = "attn_int8_fp8_sm90_kernel"

SASS_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
GUARD = re.compile(r"^@!?U?P\w+\s+")  # an instruction's guard predicate (@P0, @!UP1, ...)


def sass_functions(sass: str) -> dict[str, list[tuple[int, str]]]:
    """{mangled kernel name: [(address, instruction text without the trailing ';')]}."""
    functions = {}
    for chunk in re.split(r"\n\s*Function : ", sass)[1:]:
        name = chunk.split("\n", 1)[0].strip()
        functions[name] = [(int(a, 16), text.strip()) for a, text in SASS_INSTRUCTION.findall(chunk)]
    return functions


#: the first instruction of exp2_h2 (csrc/sm90/attn_int8_fp8.cu), which takes two scores' exp2 in f16x2
EXP2_PAIR = "F2FP.RELU.F16.F32.PACK_AB"


def exp2_count(code: Iterable[tuple[int, str]]) -> int:
    """The exp2 in a span of SASS: one per MUFU.EX2, two per f16x2 pair of exp2_h2."""
    return sum(("MUFU.EX2" in text) + 2 * (EXP2_PAIR in text) for _, text in code)


def key_loop(code: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The steady-state key loop: the shortest span from a backward branch's target to the branch
    that holds a block's softmax (64 exp2, on either path, and 2 for the rescale)."""
    index = {address: i for i, (address, _) in enumerate(code)}
    loops = []
    for i, (address, text) in enumerate(code):
        target = re.search(r"BRA\S* .*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < address and int(target.group(1), 16) in index:
            span = code[index[int(target.group(1), 16)] : i + 1]
            if exp2_count(span) >= 64:
                loops.append(span)
    if not loops:
        raise ValueError("no key loop found (no backward branch over a block's 64 exp2)")
    return min(loops, key=len)


def kernel_label(name: str) -> str:
    """'d128 causal bf16', 'd64 non-causal fp16 key-lengths' and the like, from a mangled
    attn_int8_fp8_sm90_kernel<D, kCausal, OutT, kKeyLens> name."""
    found = re.search(r"kernelILi(\d+)ELb([01])E\d+(__nv_bfloat16|__half)Lb([01])EE", name)
    if not found:
        raise ValueError(f"not an sm90 attention kernel: {name}")
    out = {"__nv_bfloat16": "bf16", "__half": "fp16"}[found.group(3)]
    lengths = " key-lengths" if found.group(4) == "1" else ""
    return f"d{found.group(1)} {'causal' if found.group(2) == '1' else 'non-causal'} {out}{lengths}"


def loop_record(code: list[tuple[int, str]]) -> dict[str, object]:
    """A key loop's length and the SHA-256 of its opcodes in order (guard predicates, operands and
    addresses dropped), one per line."""
    opcodes = [GUARD.sub("", text).split(" ", 1)[0] for _, text in key_loop(code)]
    return {
        "instructions": len(opcodes),
        "opcodes_sha256": hashlib.sha256("\n".join(opcodes).encode()).hexdigest(),
    }


def key_loops(sass_texts: Iterable[str]) -> dict[str, dict[str, object]]:
    """{kernel label: loop_record} over the attention kernels of the given SASS texts (other kernels
    in the same module, such as the fused quantization's, are passed over)."""
    return {
        kernel_label(name): loop_record(code)
        for sass in sass_texts
        for name, code in sass_functions(sass).items()
        if KERNEL_NAME in name
    }


def load_record(source_root: Path) -> dict:
    """The record: {"nvcc": "V13.0.88", "kernels": {label: loop_record}}."""
    return json.loads((Path(source_root) / RECORD).read_text())


def compare(current: dict[str, dict[str, object]], recorded: dict) -> list[str]:
    """The kernels whose loops differ from the record (or that one side lacks), as readable lines."""
    kernels = recorded["kernels"]
    lines = []
    for label in sorted(set(current) | set(kernels)):
        got, want = current.get(label), kernels.get(label)
        if got == want:
            continue
        if got is None or want is None:
            lines.append(f"{label}: {'not in the record' if want is None else 'not in this build'}")
        else:
            lines.append(
                f"{label}: {got['instructions']} instructions, {str(got['opcodes_sha256'])[:12]} "
                f"(recorded: {want['instructions']}, {str(want['opcodes_sha256'])[:12]})"
            )
    return lines
