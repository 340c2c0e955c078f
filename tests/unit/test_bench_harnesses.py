"""The CUDA harnesses in bench/ (call_sm90, trace_sm90, quant_sm_share) are built by hand on the GPU
machine, from the nvcc command each one's header documents. Each is built here with exactly that
command (the output path moved into a temporary folder), so a change to the kernels' interfaces that
breaks a harness, or a header whose command no longer builds it, fails before any GPU time is spent on
it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.cuda_toolchain import NO_NVCC, NVCC, ROOT, compile_nvcc

HARNESSES = sorted((ROOT / "bench").glob("*.cu"))


def documented_command(source: Path) -> list[str]:
    """The nvcc command of the header's `//   nvcc ...` line, with its backslash continuations."""
    lines = source.read_text().splitlines()
    for start, line in enumerate(lines):
        if re.match(r"//\s+nvcc\s", line):
            text, following = line[2:].strip(), iter(lines[start + 1 :])
            while text.endswith("\\"):
                text = text[:-1] + " " + next(following)[2:].strip()
            # "nvcc ... -o /tmp/x && /tmp/x": the build, not the run after it.
            return shlex.split(text.split("&&")[0])
    raise AssertionError(f"{source.name}: no '//   nvcc ...' build command in its header")


def test_every_harness_is_found():
    assert {p.name for p in HARNESSES} >= {"call_sm90.cu", "trace_sm90.cu", "quant_sm_share.cu"}


@pytest.mark.parametrize("source", HARNESSES, ids=lambda p: p.stem)
def test_the_header_names_the_file_itself(source):
    command = documented_command(source)
    assert command[0] == "nvcc"
    assert f"bench/{source.name}" in command
    assert "-o" in command, "the command names its binary"


# Each harness as documented, and call_sm90 with -DSAGE_QUANT_TIMES (its header's option): the fused
# quantization's timestamps and the harness's summary of them, code that nothing else builds.
BUILDS = [pytest.param(source, (), id=source.stem) for source in HARNESSES] + [
    pytest.param(ROOT / "bench" / "call_sm90.cu", ("-DSAGE_QUANT_TIMES",), id="call_sm90-quant-times")
]


@pytest.mark.skipif(NVCC is None, reason=NO_NVCC)
@pytest.mark.parametrize(("source", "extra"), BUILDS)
def test_the_documented_command_builds_it(source, extra, tmp_path, monkeypatch):
    command = documented_command(source)
    out = command.index("-o") + 1
    command[out] = str(tmp_path / Path(command[out]).name)
    monkeypatch.chdir(ROOT)  # the command's paths are the repository's
    compile_nvcc([*command[1:], *extra])
    assert (tmp_path / Path(command[out]).name).is_file()
