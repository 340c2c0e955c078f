"""``sagebuild verify`` on hand-made wheels: a good one passes; each kind of damage is caught."""

from __future__ import annotations

import json
import os
import stat
import sys
import zipfile
from pathlib import Path

import pytest
from wheel.wheelfile import WheelFile

from sagebuild import cli
from sagebuild.matrix import load
from sagebuild.verify import VerifyOptions, verify_wheel

SO = "cpython-312-x86_64-linux-gnu.so"


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
            f"sageattention/_fused.{SO}": b"\x7fELF...SASS: sm_80 sm_90a\n",
            f"sageattention/_qattn_sm80.{SO}": b"\x7fELF...SASS: sm_80 sm_90a\n",
            f"sageattention/_qattn_sm90.{SO}": b"\x7fELF...SASS: sm_90a\n",
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


def test_bad_record_hash_fails(tmp_path, matrix, fake_cuobjdump):
    good = good_cuda_wheel(tmp_path)
    bad = tmp_path / "bad" / good.name
    bad.parent.mkdir()
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == "sageattention/__init__.py":
                data = b"print('changed after RECORD was written')\n"
            dst.writestr(item, data)
    report = verify_wheel(bad, matrix, options(fake_cuobjdump))
    assert not report.passed
    assert any("RECORD" in f and "Hash mismatch" in f for f in failures(report)), report.render()


def test_torch_pin_must_match_the_tag(tmp_path, matrix, fake_cuobjdump):
    report = verify_wheel(
        good_cuda_wheel(tmp_path, requires=("torch==2.7.0",)), matrix, options(fake_cuobjdump)
    )
    assert any("the build tag says torch==2.8.0" in f for f in failures(report)), report.render()
    loose = verify_wheel(good_cuda_wheel(tmp_path, requires=("torch>=2.4",)), matrix, options(fake_cuobjdump))
    assert not loose.passed


def test_metadata_version_must_match_the_name(tmp_path, matrix, fake_cuobjdump):
    report = verify_wheel(good_cuda_wheel(tmp_path, version="2.2.1"), matrix, options(fake_cuobjdump))
    assert any("METADATA says sageattention 2.2.1" in f for f in failures(report)), report.render()


def test_wheel_build_field_must_match_the_name(tmp_path, matrix, fake_cuobjdump):
    report = verify_wheel(good_cuda_wheel(tmp_path, build="270.128"), matrix, options(fake_cuobjdump))
    assert any("WHEEL: Build '270.128'" in f for f in failures(report)), report.render()


def test_missing_extension_fails(tmp_path, matrix, fake_cuobjdump):
    wheel = good_cuda_wheel(tmp_path)
    files = {
        "sageattention/__init__.py": b"",
        f"sageattention/_fused.{SO}": b"SASS: sm_80 sm_90a\n",
        f"sageattention/_qattn_sm80.{SO}": b"SASS: sm_80 sm_90a\n",
    }
    wheel.unlink()
    report = verify_wheel(good_cuda_wheel(tmp_path, files=files), matrix, options(fake_cuobjdump))
    assert "extension sageattention._qattn_sm90: missing from the wheel" in failures(report), report.render()


def test_wrong_sass_fails(tmp_path, matrix, fake_cuobjdump):
    files = {
        f"sageattention/_fused.{SO}": b"SASS: sm_80 sm_90a\n",
        f"sageattention/_qattn_sm80.{SO}": b"SASS: sm_80 sm_90a\n",
        f"sageattention/_qattn_sm90.{SO}": b"SASS: sm_80 sm_90a\n",  # sm_80 code in the sm90-only module
    }
    report = verify_wheel(good_cuda_wheel(tmp_path, files=files), matrix, options(fake_cuobjdump))
    assert any("_qattn_sm90" in f and "expected exactly sm_90a" in f for f in failures(report)), (
        report.render()
    )


def test_expected_archs_must_match(tmp_path, matrix, fake_cuobjdump):
    report = verify_wheel(good_cuda_wheel(tmp_path), matrix, options(fake_cuobjdump, expect_archs=["9.0a"]))
    assert any("expected 9.0a" in f for f in failures(report)), report.render()


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
    wheel = good_cuda_wheel(tmp_path, build_info=None)
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
        files={f"sageattn3/_C.{SO}": b"SASS: sm_100a sm_120a\n"},
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
