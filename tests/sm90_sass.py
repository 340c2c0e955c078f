"""The sm_90a kernels' SASS as the compile tests read it, and the record of their key loops.

ptxas schedules the attention kernel's key loop anew whenever anything in the kernel function
changes, also code outside the loop, and a reordered loop has measured up to 9% slower
(bench/NOTES.md). csrc/sm90/key_loops.json therefore records, per kernel, the loop's length and a
digest of its opcode sequence (sagebuild/key_loops.py), with the nvcc that compiled it.
tests/unit/test_cuda_compile_sm90.py fails when a build with that nvcc gives another loop. After
measuring such a change against main (lengths it does not touch included), record the new loops:

    python -m tests.sm90_sass --write

``python -m tests.sm90_sass`` alone prints the loops of the current source next to the record.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from sagebuild.key_loops import RECORD, key_loops
from tests.cuda_toolchain import NO_NVCC, NVCC, compile_nvcc, cuobjdump, nvcc_flags

ROOT = Path(__file__).resolve().parents[1]
SM90_SOURCES = sorted((ROOT / "csrc" / "sm90").glob("*.cu"))
ARCH = "sm_90a"
KEY_LOOPS = ROOT / RECORD


def compile_cubin(source: Path, cubin: Path, *extra: str) -> str:
    """nvcc's log of compiling `source` into an sm_90a cubin with the package's flags (`extra` before
    them, e.g. -Xptxas -v)."""
    return compile_nvcc(["-cubin", f"-arch={ARCH}", *extra, *nvcc_flags(), str(source), "-o", str(cubin)])


def disassemble(tool: str, cubin: Path) -> str:
    """The SASS text of a cubin (`tool`: a cuobjdump)."""
    proc = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def nvcc_release(nvcc: str) -> str:
    """'V13.0.88' and the like: the exact compiler build, as ``nvcc --version`` names it."""
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"\bV(\d+\.\d+\.\d+)", out)
    return f"V{found.group(1)}" if found else "unknown"


def compile_sass() -> dict[str, str]:
    """{source name: SASS} of csrc/sm90, compiled as the compile tests compile it."""
    tool = cuobjdump()
    assert tool is not None, "no cuobjdump found (CUDA toolkit, PATH or the triton package)"
    sass = {}
    with tempfile.TemporaryDirectory() as tmp:
        for source in SM90_SOURCES:
            cubin = Path(tmp) / f"{source.stem}.cubin"
            compile_cubin(source, cubin)
            sass[source.name] = disassemble(tool, cubin)
    return sass


def main(argv: list[str]) -> int:
    if NVCC is None:
        print(NO_NVCC, file=sys.stderr)
        return 1
    current = {"nvcc": nvcc_release(NVCC), "kernels": key_loops(compile_sass().values())}
    if argv == ["--write"]:
        KEY_LOOPS.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
        print(f"wrote {KEY_LOOPS.relative_to(ROOT)} ({current['nvcc']})")
        return 0
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    recorded = json.loads(KEY_LOOPS.read_text()) if KEY_LOOPS.is_file() else {"nvcc": None, "kernels": {}}
    print(f"nvcc {current['nvcc']} (record: {recorded['nvcc']})")
    for label, loop in sorted(current["kernels"].items()):
        old = recorded["kernels"].get(label)
        same = "same as recorded" if old == loop else f"recorded: {old}"
        print(f"{label:24s} {loop['instructions']:4d} instructions, {loop['opcodes_sha256'][:16]}  {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
