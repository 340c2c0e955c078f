"""``sagebuild verify`` on hand-made wheels: a good one passes; each kind of damage is caught.

The section "Every way a wheel can be broken" lists the failure modes, one row each.
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
import sys
import zipfile
from pathlib import Path

import pytest
from wheel.wheelfile import WheelFile

from sagebuild import cli, key_loops
from sagebuild.matrix import Arch, load
from sagebuild.verify import VerifyOptions, verify_wheel

SO = "cpython-312-x86_64-linux-gnu.so"
EM_X86_64, EM_AARCH64 = 62, 183


def fake_library(payload: bytes, machine: int = EM_X86_64) -> bytes:
    """A minimal 64-bit little-endian ELF shared object: one loadable segment, and one section that
    holds ``payload`` (where the stand-in cuobjdump reads its ``SASS:`` line)."""
    ehdr, phdr, shdr = 64, 56, 64
    data_at = ehdr + phdr
    sections_at = data_at + len(payload)
    ident = b"\x7fELF\x02\x01\x01" + bytes(9)
    header = struct.pack(
        "<16sHHIQQQIHHHHHH", ident, 3, machine, 1, 0, ehdr, sections_at, 0, ehdr, phdr, 1, shdr, 2, 0
    )
    load = struct.pack("<IIQQQQQQ", 1, 5, 0, 0, 0, sections_at, sections_at, 0x1000)
    section = struct.pack("<IIQQQQIIQQ", 0, 1, 2, data_at, data_at, len(payload), 0, 0, 1, 0)
    return header + load + payload + bytes(shdr) + section


def sass(*archs: str, text: str = "") -> bytes:
    """A compiled module holding SASS for these archs (as the stand-in cuobjdump lists them), and
    ``text`` as what its ``cuobjdump -sass`` prints."""
    return fake_library(f"SASS: {' '.join(archs)}\nSASSTEXT\n{text}".encode())


@pytest.fixture(scope="module")
def matrix():
    return load()


@pytest.fixture(scope="module")
def fake_cuobjdump(tmp_path_factory) -> Path:
    """Stands in for cuobjdump: a 'binary' lists its cubins on a line ``SASS: sm_80 sm_90a``."""
    path = tmp_path_factory.mktemp("bin") / "cuobjdump"
    path.write_text(
        f"#!{sys.executable}\n"
        "import re, sys\n"
        "flag, binary = sys.argv[1], sys.argv[2]\n"
        "text = open(binary, 'rb').read().decode('latin-1')\n"
        "if flag == '--list-elf':\n"
        "    found = re.search(r'SASS: ([^\\n]*)', text)\n"
        "    if not found:\n"
        "        print(f\"cuobjdump info    : File '{binary}' does not contain device code\")\n"
        "        sys.exit(255)\n"
        "    for i, sm in enumerate(found.group(1).split(), 1):\n"
        "        print(f'ELF file    {i}: x.{i}.{sm}.cubin')\n"
        "elif flag == '-sass':\n"
        "    print(text.split('SASSTEXT\\n', 1)[1] if 'SASSTEXT\\n' in text else '')\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def make_wheel(
    folder: Path,
    filename: str,
    *,
    version: str = "2.2.0",
    requires=("torch==2.8.0",),
    build: str | None = "280.129",
    tag: str = "cp312-cp312-linux_x86_64",
    files: dict[str, bytes] | None = None,
    build_info: dict | None = None,
    pure: bool = False,
) -> Path:
    project = filename.split("-")[0]
    path = folder / filename
    with WheelFile(str(path), "w") as wheel:
        for name, data in (files or {}).items():
            wheel.writestr(name, data)
        if build_info is not None:
            wheel.writestr(f"{project}/_build_info.json", json.dumps(build_info))
        meta = ["Metadata-Version: 2.4", f"Name: {project}", f"Version: {version}"]
        meta += [f"Requires-Dist: {r}" for r in requires]
        wheel.writestr(f"{wheel.dist_info_path}/METADATA", "\n".join(meta) + "\n\n")
        info = ["Wheel-Version: 1.0", "Generator: test", f"Root-Is-Purelib: {'true' if pure else 'false'}"]
        info += [f"Tag: {tag}"] + ([f"Build: {build}"] if build else [])
        wheel.writestr(f"{wheel.dist_info_path}/WHEEL", "\n".join(info) + "\n")
    return path


def good_cuda_wheel(folder: Path, **changes) -> Path:
    spec = dict(
        files={
            "sageattention/__init__.py": b"",
            f"sageattention/_fused.{SO}": sass("sm_80", "sm_90a"),
            f"sageattention/_qattn_sm80.{SO}": sass("sm_80", "sm_90a"),
            f"sageattention/_qattn_sm90.{SO}": sass("sm_90a"),
        },
        build_info={
            "torch": "2.8.0",
            "torch_cuda": "12.9",
            "nvcc": "12.9.86",
            "archs": ["8.0", "9.0a"],
            "extensions": {
                "sageattention._fused": ["8.0", "9.0a"],
                "sageattention._qattn_sm80": ["8.0", "9.0a"],
                "sageattention._qattn_sm90": ["9.0a"],
            },
            "skipped": {"sageattention._qattn_sm89": "no kernel sources"},
        },
    )
    spec.update(changes)
    return make_wheel(folder, "sageattention-2.2.0-280.129-cp312-cp312-linux_x86_64.whl", **spec)


def options(cuobjdump: Path | None, **kw) -> VerifyOptions:
    return VerifyOptions(smoke=False, cuobjdump=str(cuobjdump) if cuobjdump else None, **kw)


def failures(report) -> list[str]:
    return [c.label for c in report.checks if c.status == "fail"]


def test_good_wheel_passes(tmp_path, matrix, fake_cuobjdump):
    report = verify_wheel(
        good_cuda_wheel(tmp_path), matrix, options(fake_cuobjdump, expect_archs=["8.0", "9.0a"])
    )
    assert report.passed, report.render()
    text = report.render()
    for line in (
        "✓ SageAttention version: 2.2.0",
        "✓ PyTorch version tag: 280 (2.8.0)",
        "✓ CUDA version tag: 129 (12.9)",
        "✓ Python version: 312 (3.12)",
        "✓ SASS sageattention/_qattn_sm90.cpython-312-x86_64-linux-gnu.so: sm_90a",
    ):
        assert line in text


def test_missing_cuobjdump_is_said_and_fails_unless_allowed(tmp_path, matrix, monkeypatch):
    monkeypatch.setattr("sagebuild.verify.find_cuobjdump", lambda options, min_cuda=None: None)
    wheel = good_cuda_wheel(tmp_path)
    report = verify_wheel(wheel, matrix, options(None))
    assert any("no cuobjdump of CUDA" in f and "--allow-missing-cuobjdump" in f for f in failures(report))
    allowed = verify_wheel(wheel, matrix, options(None, allow_missing_cuobjdump=True))
    assert allowed.passed and any(
        c.status == "skip" and "SASS check skipped" in c.label for c in allowed.checks
    )


def test_no_build_info_needs_expected_archs(tmp_path, matrix, fake_cuobjdump):
    """Without build info, the modules and archs are the matrix's plan for --expect-archs."""
    planned = {
        f"sageattention/{p.name.split('.')[-1]}.{SO}": sass(*(Arch.parse(a).sm for a in p.archs))
        for p in matrix.extension_plan("sageattention", ["8.0", "9.0a"])
        if p.archs
    }
    wheel = good_cuda_wheel(tmp_path, build_info=None, files={"sageattention/__init__.py": b"", **planned})
    report = verify_wheel(wheel, matrix, options(fake_cuobjdump))
    assert any("cannot tell which archs" in f for f in failures(report))
    report = verify_wheel(wheel, matrix, options(fake_cuobjdump, expect_archs=["8.0", "9.0a"]))
    assert report.passed, report.render()


def test_pure_wheel(tmp_path, matrix):
    pure = make_wheel(
        tmp_path,
        "sageattention-2.2.0-py3-none-any.whl",
        requires=("torch>=2.4",),
        build=None,
        tag="py3-none-any",
        pure=True,
        files={"sageattention/__init__.py": b""},
    )
    report = verify_wheel(pure, matrix, options(None))
    assert report.passed, report.render()
    other = tmp_path / "pinned"
    other.mkdir()
    pinned = make_wheel(
        other,
        "sageattention-2.2.0-py3-none-any.whl",
        requires=("torch==2.8.0",),
        build=None,
        tag="py3-none-any",
        pure=True,
    )
    assert any("without an exact pin" in f for f in failures(verify_wheel(pinned, matrix, options(None))))


def test_sageattn3_local_version(tmp_path, matrix, fake_cuobjdump):
    wheel = make_wheel(
        tmp_path,
        "sageattn3-1.0.0+cu128torch2.9.0-cp312-cp312-linux_x86_64.whl",
        version="1.0.0+cu128torch2.9.0",
        requires=("torch==2.9.0",),
        build=None,
        files={f"sageattn3/_C.{SO}": sass("sm_100a", "sm_120a")},
    )
    report = verify_wheel(wheel, matrix, options(fake_cuobjdump))
    assert report.passed, report.render()
    assert "✓ local version: +cu128torch2.9.0 (PyTorch 2.9.0, CUDA 12.8)" in report.render()


def test_cli_exit_code_and_marks(tmp_path, fake_cuobjdump, capsys):
    good = good_cuda_wheel(tmp_path)
    assert cli.main(["verify", str(good), "--no-smoke", "--cuobjdump", str(fake_cuobjdump)]) == 0
    bad_name = tmp_path / "sageattention-2.2.0-cp312-cp312-linux_x86_64.whl"
    os.link(good, bad_name)
    assert (
        cli.main(["verify", str(good), str(bad_name), "--no-smoke", "--cuobjdump", str(fake_cuobjdump)]) == 1
    )
    out = capsys.readouterr().out
    assert "✗ file name:" in out and "must carry the {torch}.{cuda} build tag" in out
    assert "1 of 2 wheels passed" in out


def _versioned_cuobjdump(folder: Path, release: str) -> Path:
    folder.mkdir(parents=True)
    path = folder / "cuobjdump"
    path.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.0'\n")
    path.chmod(0o755)
    return path


def test_an_older_cuobjdump_is_passed_over(tmp_path, monkeypatch):
    """A cuobjdump older than the wheel's CUDA cannot name its targets (CUDA 12.8's lists a sm_90a cubin
    as sm_90): the first one of that CUDA or newer is taken, and none at all is better than an old one."""
    from sagebuild.verify import cuobjdump_version, find_cuobjdump

    old = _versioned_cuobjdump(tmp_path / "old", "12.8")
    new = _versioned_cuobjdump(tmp_path / "new", "13.1")
    assert cuobjdump_version(old) == (12, 8) and cuobjdump_version(new) == (13, 1)
    monkeypatch.setenv("SAGEBUILD_CUOBJDUMP", str(new))
    opts = VerifyOptions(smoke=False, cuobjdump=str(old))
    assert find_cuobjdump(opts) == old  # no CUDA to match: the first candidate
    assert find_cuobjdump(opts, (13, 0)) == new
    monkeypatch.delenv("SAGEBUILD_CUOBJDUMP")
    monkeypatch.setenv("PATH", str(tmp_path / "old"))
    monkeypatch.setattr("sys.path", [])
    assert find_cuobjdump(VerifyOptions(smoke=False, cuobjdump=str(old)), (13, 0)) is None


# --------------------------------------------------------------------------------------------------
# Every way a wheel can be broken, one row each: how the good wheel is made wrong, and the failed
# checks ``verify`` must report. Damage is done member by member to a copy of the good wheel; with
# ``record="rewrite"`` the copy gets a RECORD that matches its damaged contents (as a tool repacking
# the wheel would write), so that the check under test must catch it on its own.

GOOD = "sageattention-2.2.0-280.129-cp312-cp312-linux_x86_64.whl"


def so(module: str) -> str:
    return f"sageattention/{module}.{SO}"


def damaged(
    folder: Path,
    *,
    replace: dict[str, bytes] | None = None,
    drop: tuple[str, ...] = (),
    add: dict[str, bytes] | None = None,
    record: str = "rewrite",
    name: str = GOOD,
    **changes,
) -> Path:
    """A copy of the good wheel (``changes`` go to good_cuda_wheel) with members replaced, dropped or
    added, RECORD rewritten to match or kept as it was, under file name ``name``."""
    (folder / "good").mkdir()
    (folder / "broken").mkdir()
    source = good_cuda_wheel(folder / "good", **changes)
    target = folder / "broken" / name
    with zipfile.ZipFile(source) as src:
        members = [(info, src.read(info)) for info in src.infolist() if info.filename not in drop]
    members = [(info, (replace or {}).get(info.filename, data)) for info, data in members]
    if record == "rewrite":
        with WheelFile(str(target), "w") as wheel:
            for info, data in members:
                if not info.filename.endswith(".dist-info/RECORD"):
                    wheel.writestr(info.filename, data)
            for member, data in (add or {}).items():
                wheel.writestr(member, data)
    else:
        with zipfile.ZipFile(target, "w") as wheel:
            for info, data in members:
                wheel.writestr(info, data)
            for member, data in (add or {}).items():
                wheel.writestr(member, data)
    return target


def truncated(folder: Path) -> Path:
    """A wheel cut off in the middle, as an interrupted copy leaves it."""
    good = good_cuda_wheel(folder)
    data = good.read_bytes()
    good.write_bytes(data[: len(data) // 2])
    return good


def half(data: bytes) -> bytes:
    return data[: len(data) // 2]


INFO = {
    "torch": "2.8.0",
    "torch_cuda": "12.9",
    "nvcc": "12.9.86",
    "archs": ["8.0", "9.0a"],
    "extensions": {
        "sageattention._fused": ["8.0", "9.0a"],
        "sageattention._qattn_sm80": ["8.0", "9.0a"],
        "sageattention._qattn_sm90": ["9.0a"],
    },
}
FILES = {
    "sageattention/__init__.py": b"",
    so("_fused"): sass("sm_80", "sm_90a"),
    so("_qattn_sm80"): sass("sm_80", "sm_90a"),
    so("_qattn_sm90"): sass("sm_90a"),
}
SM90_SO = so("_qattn_sm90")
OTHER = "sageattention-2.2.0-270.128-cp312-cp312-linux_x86_64.whl"

BROKEN = [
    # id, make(folder) -> wheel, VerifyOptions extras, failures that must be reported (substrings)
    # -- an extension module missing or corrupted
    ("extension_removed", lambda f: damaged(f, drop=(SM90_SO,)), {},
     ["extension sageattention._qattn_sm90: missing from the wheel"]),
    ("extension_removed_record_kept", lambda f: damaged(f, drop=(SM90_SO,), record="keep"), {},
     [f"RECORD: listed but absent: {SM90_SO}", "extension sageattention._qattn_sm90: missing"]),
    ("extension_bytes_changed",
     lambda f: damaged(f, replace={SM90_SO: sass("sm_90a") + b"\0"}, record="keep"), {},
     [f"Hash mismatch for file '{SM90_SO}'", f"binary {SM90_SO}: unreadable"]),
    ("extension_truncated_record_rewritten", lambda f: damaged(f, replace={SM90_SO: half(sass("sm_90a"))}),
     {}, [f"binary {SM90_SO}: ", "past the end of the file"]),
    ("extension_overwritten_record_rewritten",
     lambda f: damaged(f, replace={SM90_SO: b"\0" * 4096}), {},
     [f"binary {SM90_SO}: not an ELF file", f"SASS {SM90_SO}: has none, expected exactly sm_90a"]),
    ("extension_for_another_machine",
     lambda f: damaged(f, replace={SM90_SO: fake_library(b"SASS: sm_90a\n", EM_AARCH64)}), {},
     [f"binary {SM90_SO}: ELF machine 183, but the wheel is for x86-64"]),
    ("extension_not_in_build_info", lambda f: damaged(f, add={so("_qattn_sm89"): sass("sm_90a")}), {},
     ["extension sageattention._qattn_sm89: in the wheel but not in its build info"]),
    # -- the arch list: SASS against the build info, the build info against the matrix and the tag
    ("sass_for_an_arch_not_claimed", lambda f: damaged(f, replace={SM90_SO: sass("sm_80", "sm_90a")}), {},
     [f"SASS {SM90_SO}: has sm_80, sm_90a, expected exactly sm_90a"]),
    ("sass_missing_a_claimed_arch", lambda f: damaged(f, replace={so("_fused"): sass("sm_80")}), {},
     [f"SASS {so('_fused')}: has sm_80, expected exactly sm_80, sm_90a"]),
    ("sass_none", lambda f: damaged(f, replace={so("_fused"): fake_library(b"host code only")}), {},
     [f"SASS {so('_fused')}: has none"]),
    ("archs_not_the_expected", lambda f: good_cuda_wheel(f), {"expect_archs": ["9.0a"]},
     ["the wheel was built for 8.0;9.0a, expected 9.0a"]),
    ("build_info_module_archs_not_the_matrix",
     lambda f: good_cuda_wheel(f, build_info={**INFO, "extensions": {**INFO["extensions"],
                                              "sageattention._qattn_sm90": ["8.0", "9.0a"]}}),
     {}, ["sageattention._qattn_sm90: build info says 8.0;9.0a, the matrix gives 9.0a"]),
    ("build_info_arch_the_tag_cuda_cannot_target",
     lambda f: good_cuda_wheel(f, build_info={**INFO, "archs": ["8.0", "9.0a", "11.0a"]}), {},
     ["arch 11.0a: "]),
    ("build_info_torch_not_the_tag", lambda f: good_cuda_wheel(f, build_info={**INFO, "torch": "2.7.0"}), {},
     ["build info disagrees with the name: torch 2.7.0 != 2.8.0"]),
    ("build_info_cuda_not_the_tag", lambda f: good_cuda_wheel(f, build_info={**INFO, "torch_cuda": "12.8"}),
     {}, ["build info disagrees with the name: torch CUDA 12.8 != 12.9"]),
    ("build_info_not_json",
     lambda f: damaged(f, replace={"sageattention/_build_info.json": b"{'archs': "}), {},
     ["sageattention/_build_info.json: not valid JSON"]),
    # -- the file name's tags against METADATA and WHEEL
    ("metadata_version", lambda f: good_cuda_wheel(f, version="2.2.1"), {},
     ["METADATA says sageattention 2.2.1, the file name says sageattention 2.2.0"]),
    ("metadata_torch_pin_another_torch", lambda f: good_cuda_wheel(f, requires=("torch==2.7.0",)), {},
     ["Requires-Dist torch==2.7.0, but the build tag says torch==2.8.0"]),
    ("metadata_torch_pin_loose", lambda f: good_cuda_wheel(f, requires=("torch>=2.4",)), {},
     ["Requires-Dist torch>=2.4, but the build tag says torch==2.8.0"]),
    ("metadata_torch_pin_missing", lambda f: good_cuda_wheel(f, requires=()), {},
     ["Requires-Dist (none), but the build tag says torch==2.8.0"]),
    ("wheel_build_field", lambda f: good_cuda_wheel(f, build="270.128"), {},
     ["WHEEL: Build '270.128' != file name's '280.129'"]),
    ("wheel_tag", lambda f: good_cuda_wheel(f, tag="cp311-cp311-linux_x86_64"), {},
     ["WHEEL: Tag cp311-cp311-linux_x86_64 != file name's cp312-cp312-linux_x86_64"]),
    ("wheel_root_is_purelib", lambda f: good_cuda_wheel(f, pure=True), {},
     ["Root-Is-Purelib True for a platform wheel"]),
    ("renamed_to_another_torch", lambda f: damaged(f, name=OTHER), {},
     ["but the build tag says torch==2.7.0", "WHEEL: Build '280.129' != file name's '270.128'",
      "build info disagrees with the name: torch 2.8.0 != 2.7.0"]),
    ("renamed_to_another_python",
     lambda f: damaged(f, name=GOOD.replace("cp312-cp312", "cp311-cp311")), {},
     ["WHEEL: Tag cp312-cp312-linux_x86_64 != file name's cp311-cp311-linux_x86_64"]),
    # -- RECORD and the archive
    ("record_hash",
     lambda f: damaged(f, replace={"sageattention/__init__.py": b"x = 1\n"}, record="keep"), {},
     ["Hash mismatch for file 'sageattention/__init__.py'"]),
    ("record_lacks_a_file", lambda f: damaged(f, add={"sageattention/extra.py": b""}, record="keep"), {},
     ["No hash found for file 'sageattention/extra.py'"]),
    ("record_missing",
     lambda f: damaged(f, drop=("sageattention-2.2.0.dist-info/RECORD",), record="keep"), {},
     ["archive: Missing sageattention-2.2.0.dist-info/RECORD file"]),
    ("archive_truncated", truncated, {}, ["archive: File is not a zip file"]),
]  # fmt: skip


@pytest.mark.parametrize("make,extra,expected", [r[1:] for r in BROKEN], ids=[r[0] for r in BROKEN])
def test_broken_wheel_is_rejected(tmp_path, matrix, fake_cuobjdump, make, extra, expected):
    report = verify_wheel(make(tmp_path), matrix, options(fake_cuobjdump, **extra))
    assert not report.passed, report.render()
    failed = failures(report)
    for text in expected:
        assert any(text in f for f in failed), f"no failure says {text!r}:\n{report.render()}"


def test_every_failure_mode_has_a_unique_name_and_the_good_wheel_passes(tmp_path, matrix, fake_cuobjdump):
    assert len({r[0] for r in BROKEN}) == len(BROKEN)
    assert good_cuda_wheel(tmp_path, build_info=INFO, files=FILES).is_file()
    report = verify_wheel(good_cuda_wheel(tmp_path), matrix, options(fake_cuobjdump))
    assert report.passed, report.render()
    assert (
        f"✓ binary {SM90_SO}: ELF64 x86-64 shared object, 1 loadable segments, 2 sections" in report.render()
    )


def fake_dll(payload: bytes, machine: int = 0x8664, characteristics: int = 0x2022) -> bytes:
    """A minimal PE file (a Windows ``.pyd``): MZ stub, PE header, no optional header, one section."""
    pe_at, table_at = 0x40, 0x40 + 24
    data_at = table_at + 40
    stub = b"MZ" + bytes(0x3A) + struct.pack("<I", pe_at)
    header = b"PE\0\0" + struct.pack("<HHIIIHH", machine, 1, 0, 0, 0, 0, characteristics)
    section = b".nv_fatb" + struct.pack("<IIIIIIHHI", 0, 0, len(payload), data_at, 0, 0, 0, 0, 0)
    return stub + header + section + payload


def test_compiled_module_shapes():
    """The ELF and PE checks on their own: whole files pass; cut, foreign or non-library ones fail."""
    from sagebuild.verify import BinaryError, binary_summary

    lib = sass("sm_90a")
    assert binary_summary("m.so", lib, "manylinux_2_28_x86_64").startswith("ELF64 x86-64 shared object")
    dll = fake_dll(b"SASS: sm_90a\n")
    assert binary_summary("m.pyd", dll, "win_amd64") == "PE x86-64 DLL, 1 sections"
    bad = [
        ("m.so", lib[:200], "linux_x86_64", "past the end of the file"),
        ("m.so", lib[:40], "linux_x86_64", "not an ELF file"),
        ("m.so", fake_library(b"", EM_AARCH64), "linux_x86_64", "ELF machine 183"),
        ("m.so", lib, "linux_aarch64", "ELF machine 62, but the wheel is for aarch64"),
        ("m.so", lib[:16] + struct.pack("<H", 2) + lib[18:], "linux_x86_64", "not a shared object"),
        ("m.so", lib[:4] + b"\x01" + lib[5:], "linux_x86_64", "not a 64-bit little-endian ELF file"),
        ("m.pyd", dll[:-4], "win_amd64", "section 0 ends at byte"),
        ("m.pyd", dll, "win_arm64", "PE machine 0x8664, but the wheel is for aarch64"),
        ("m.pyd", fake_dll(b"", characteristics=0x22), "win_amd64", "not a DLL"),
        ("m.pyd", lib, "win_amd64", "not a PE file"),
    ]
    for member, data, platform, message in bad:
        with pytest.raises(BinaryError, match=re.escape(message)):
            binary_summary(member, data, platform)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a real ELF library of this machine")
def test_real_shared_library_passes_and_its_halves_fail():
    import torch

    data = Path(torch._C.__file__).read_bytes()
    from sagebuild.verify import BinaryError, binary_summary

    assert binary_summary(torch._C.__file__, data, "linux_x86_64").startswith("ELF64 ")
    for cut in (len(data) // 2, len(data) - 512):  # (the last bytes may be padding no table covers)
        with pytest.raises(BinaryError, match="past the end of the file"):
            binary_summary(torch._C.__file__, data[:cut], "linux_x86_64")


# ----------------------------------------------------------------------------------------------------
# The sm_90a key loops: the ones measured, or a note that the wheel's Hopper speed is unmeasured

# label -> the mangled template arguments of attn_int8_fp8_sm90_kernel<D, kCausal, OutT, kKeyLens>
KERNELS = {
    f"d{d} {'causal' if c else 'non-causal'} {t}{' key-lengths' * lens}": f"ILi{d}ELb{c}E{o}Lb{lens}EEEv"
    for d in (64, 128)
    for c in (0, 1)
    for t, o in (("bf16", "13__nv_bfloat16"), ("fp16", "6__half"))
    for lens in ((0, 1) if c == 0 else (0,))
}


def fake_attention_sass(swapped: frozenset = frozenset()) -> str:
    """cuobjdump -sass of the eight attention kernels and a quantization kernel, each attention kernel
    with a key loop (a backward branch over 66 exp2); in the ``swapped`` ones two of its opcodes trade
    places."""
    chunks = ["\t\tFunction : _ZN4sage12quant_kernelEv\n        /*0000*/   EXIT ;\n"]
    for label, args in KERNELS.items():
        body = ["IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28]", "I2FP.F32.S32 R4, R4", "FFMA R4, R4, R5, -R6"]
        body += ["MUFU.EX2 R7, R4"] * 66 + ["F2FP.SATFINITE.E4M3.F32.PACK_AB R8, R7, R7"]
        if label in swapped:
            body[1], body[2] = body[2], body[1]
        lines = [f"        /*{16 * i:04x}*/   {op} ;" for i, op in enumerate(body)]
        lines.append(f"        /*{16 * len(body):04x}*/   @P0 BRA 0x10 ;")
        lines.append(f"        /*{16 * len(body) + 16:04x}*/   EXIT ;")
        name = f"_ZN4sage49_GLOBAL__N__attn_int8_fp8_sm90_kernel{args}14CUtensorMap_st"
        chunks.append(f"\t\tFunction : {name}\n" + "\n".join(lines) + "\n")
    return "\n".join(chunks)


@pytest.fixture()
def measured(monkeypatch):
    """The record as if the unswapped fake loops were the measured ones."""
    record = {"nvcc": "V13.0.88", "kernels": key_loops.key_loops([fake_attention_sass()])}
    monkeypatch.setattr("sagebuild.key_loops.load_record", lambda source_root: record)
    return record


def sm90_wheel(folder: Path, text: str) -> Path:
    files = {
        "sageattention/__init__.py": b"",
        f"sageattention/_fused.{SO}": sass("sm_80", "sm_90a"),
        f"sageattention/_qattn_sm80.{SO}": sass("sm_80", "sm_90a"),
        f"sageattention/_qattn_sm90.{SO}": sass("sm_90a", text=text),
    }
    return good_cuda_wheel(folder, files=files)


def test_the_measured_key_loops_are_said(tmp_path, matrix, fake_cuobjdump, measured):
    report = verify_wheel(sm90_wheel(tmp_path, fake_attention_sass()), matrix, options(fake_cuobjdump))
    assert report.passed, report.render()
    said = "✓ sm_90a key loops: the 12 measured ones (csrc/sm90/key_loops.json, nvcc V13.0.88)"
    assert said in report.render()


def test_other_key_loops_are_a_note_not_a_failure(tmp_path, matrix, fake_cuobjdump, measured):
    swapped = frozenset({"d128 non-causal bf16", "d64 causal fp16"})
    report = verify_wheel(sm90_wheel(tmp_path, fake_attention_sass(swapped)), matrix, options(fake_cuobjdump))
    assert report.passed, report.render()
    notes = [c.label for c in report.checks if c.status == "note"]
    assert len(notes) == 1 and notes[0].startswith("sm_90a key loops: 2 of 12 differ from the measured ones")
    assert "Hopper speed is unmeasured" in notes[0]
    for label in swapped:
        assert f"{label}: 70 instructions" in notes[0]
    assert "! sm_90a key loops: 2 of 12 differ" in report.render()


def test_a_module_without_its_key_loops_fails(tmp_path, matrix, fake_cuobjdump, measured):
    """An sm_90a attention kernel in which no key loop can be found is not one this source builds."""
    broken = fake_attention_sass().replace("@P0 BRA 0x10", "NOP")  # no backward branch anywhere
    report = verify_wheel(sm90_wheel(tmp_path, broken), matrix, options(fake_cuobjdump))
    assert any("sm_90a key loops" in f and "no key loop found" in f for f in failures(report)), (
        report.render()
    )


def test_key_loop_record_and_compare():
    """The loop is the shortest backward-branch span over 64 exp2; compare names what changed."""
    loops = key_loops.key_loops([fake_attention_sass()])
    assert set(loops) == set(KERNELS) and {loop["instructions"] for loop in loops.values()} == {70}
    record = {"nvcc": "V13.0.88", "kernels": loops}
    assert key_loops.compare(loops, record) == []
    fewer = {label: loop for label, loop in loops.items() if label != "d64 causal bf16"}
    assert key_loops.compare(fewer, record) == ["d64 causal bf16: not in this build"]
    with pytest.raises(ValueError, match="not an sm90 attention kernel"):
        key_loops.kernel_label("_ZN4sage12quant_kernelEv")


AARCH64_ABI3 = "sageattention-2.2.0-cp310-abi3-manylinux_2_28_aarch64.whl"


def aarch64_abi3_wheel(folder: Path, machine: int = EM_AARCH64, filename: str = AARCH64_ABI3) -> Path:
    """The repaired abi3 wheel of linux-aarch64 (the default CUDA line), its modules for ``machine``."""
    module = fake_library(b"SASS: sm_80 sm_90a\n", machine)
    tag = filename[: -len(".whl")].split("-", 2)[2]
    return make_wheel(
        folder,
        filename,
        requires=("torch>=2.6.0",),
        build=None,
        tag=tag,
        files={
            "sageattention/__init__.py": b"",
            "sageattention/_fused.abi3.so": module,
            "sageattention/_qattn_sm80.abi3.so": module,
        },
        build_info={
            "torch": "2.14.1",
            "torch_cuda": "13.0",
            "nvcc": "13.0.88",
            "archs": ["8.0", "9.0a"],
            "wheel_kind": "abi3",
            "cuda_line": "13",
            "extensions": {
                "sageattention._fused": ["8.0", "9.0a"],
                "sageattention._qattn_sm80": ["8.0", "9.0a"],
            },
        },
    )


def test_an_aarch64_abi3_wheel_is_decoded_and_checked(tmp_path, matrix, fake_cuobjdump):
    """manylinux_2_28_aarch64 (and linux_aarch64, as built) is the linux-aarch64 platform's tag: the name,
    WHEEL's tag and the modules' ELF machine are checked against it."""
    report = verify_wheel(aarch64_abi3_wheel(tmp_path), matrix, options(fake_cuobjdump))
    assert report.passed, report.render()
    text = report.render()
    said = {
        "the line": "✓ abi3 wheel: CUDA 13.x line (the default line, no local version), every torch >= 2.6.0",
        "the platform": "✓ platform: manylinux_2_28_aarch64 (linux-aarch64)",
        "WHEEL": "✓ WHEEL: build (none), tag cp310-abi3-manylinux_2_28_aarch64",
        "the CPU": "✓ binary sageattention/_fused.abi3.so: ELF64 aarch64 shared object",
    }
    assert [what for what, line in said.items() if line not in text] == [], text
    built = tmp_path / "built"
    built.mkdir()
    report = verify_wheel(
        aarch64_abi3_wheel(built, filename="sageattention-2.2.0-cp310-abi3-linux_aarch64.whl"),
        matrix,
        options(fake_cuobjdump),
    )
    assert report.passed and "✓ platform: linux_aarch64 (linux-aarch64)" in report.render()
    # x86-64 modules in an aarch64 wheel are refused
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    report = verify_wheel(aarch64_abi3_wheel(wrong, EM_X86_64), matrix, options(fake_cuobjdump))
    assert any("ELF machine 62, but the wheel is for aarch64" in f for f in failures(report)), report.render()


def test_an_aarch64_per_torch_wheel_of_a_build_pytorch_does_not_publish_there_fails(tmp_path, matrix):
    """PyTorch 2.8.0 has no aarch64 CUDA 12.8 build (platform_cuda): such a wheel names a torch that
    cannot be installed there."""
    tag = "cp312-cp312-manylinux_2_28_aarch64"
    wheel = make_wheel(tmp_path, f"sageattention-2.2.0-280.128-{tag}.whl", build="280.128", tag=tag)
    report = verify_wheel(wheel, matrix, options(None, allow_missing_cuobjdump=True))
    assert "✓ platform: manylinux_2_28_aarch64 (linux-aarch64)" in report.render()
    assert any(
        "combination: PyTorch 2.8.0 has no CUDA 12.8 build for linux-aarch64; there it ships CUDA 12.9" in f
        for f in failures(report)
    ), report.render()
