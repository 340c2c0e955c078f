"""`sagebuild release-check`: the release publishes exactly the planned wheels of both packages, once each,
named as planned, with SHA256SUMS, and never over an existing asset."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from sagebuild import cli, release
from sagebuild.matrix import load

PROFILES = ["sage2-all", "sage3-all"]


@pytest.fixture(scope="module")
def matrix():
    return load()


@pytest.fixture
def artifacts(matrix, tmp_path) -> Path:
    """What actions/download-artifact leaves: one folder per build, wheels-<build id>/<wheel>."""
    root = tmp_path / "artifacts"
    for target in release.planned_targets(matrix, PROFILES):
        folder = root / f"wheels-{target.id}"
        folder.mkdir(parents=True)
        (folder / target.wheel_name).write_bytes(target.id.encode())
    return root


def tag(matrix) -> str:
    return "v" + matrix.package_version("sageattention")


def test_complete_release_passes(matrix, artifacts):
    report = release.check_release(matrix, artifacts, PROFILES, tag=tag(matrix), existing=["notes.txt"])
    assert report.passed, report.render()
    # 10 sageattention builds on each of linux, windows and linux-aarch64, and the sageattn3 builds
    # of sage3-all: one release for both packages
    sage3 = len(matrix.profile_targets("sage3-all"))
    assert report.planned == len(report.wheels) == 3 * 10 + sage3
    assert {p.name.split("-")[0] for p in report.wheels} == {"sageattention", "sageattn3"}


def test_cli_collects_and_writes_sha256sums(matrix, artifacts, tmp_path, capsys):
    out = tmp_path / "release"
    code = cli.main(
        ["release-check", str(artifacts), "--profile", " ".join(PROFILES), "--tag", tag(matrix)]
        + ["--collect", str(out), "--sha256sums", str(out / "SHA256SUMS")]
    )
    assert code == 0, capsys.readouterr()
    wheels = sorted(out.glob("*.whl"))
    planned = len(release.planned_targets(matrix, PROFILES))
    assert len(wheels) == planned and any(w.name.endswith("_aarch64.whl") for w in wheels)
    lines = (out / "SHA256SUMS").read_text(encoding="utf-8").splitlines()
    assert len(lines) == planned
    for line, wheel in zip(lines, wheels):
        digest, name = line.split("  ")
        assert name == wheel.name and digest == hashlib.sha256(wheel.read_bytes()).hexdigest()


def problems(matrix, root, **kwargs) -> list[str]:
    report = release.check_release(matrix, root, PROFILES, **kwargs)
    assert not report.passed
    return report.problems


def test_missing_wheel(matrix, artifacts):
    victim = next(artifacts.glob("wheels-windows-sageattn3-*/*.whl"))
    victim.unlink()
    assert any(p.startswith(f"missing: {victim.name}") for p in problems(matrix, artifacts))


def test_same_name_from_two_artifacts(matrix, artifacts):
    wheel = next(artifacts.glob("wheels-linux-sageattention-pytorch28-cu129-python312/*.whl"))
    extra = artifacts / "wheels-linux-sageattention-pytorch28-cu129-python312-sm90a"
    extra.mkdir()
    (extra / wheel.name).write_bytes(b"other")
    assert any("comes from 2 artifacts" in p for p in problems(matrix, artifacts))


def test_unplanned_wheel_and_stray_file(matrix, artifacts):
    folder = artifacts / "wheels-linux-sageattention-pytorch2141-cu130-python312"
    folder.mkdir()
    (folder / "sageattention-2.2.0-2141.130-cp312-cp312-linux_x86_64.whl").write_bytes(b"x")
    (artifacts / "build.log").write_text("log", encoding="utf-8")
    found = problems(matrix, artifacts)
    assert any("not a build of sage2-all + sage3-all" in p for p in found)
    assert any("build.log: not a wheel" in p for p in found)


def test_badly_named_wheel(matrix, artifacts):
    wheel = next(artifacts.glob("wheels-linux-sageattention-pytorch26-cu126-python39/*.whl"))
    wheel.rename(wheel.with_name("sageattention-2.2.0-cp39-cp39-linux_x86_64.whl"))  # build tag lost
    found = problems(matrix, artifacts)
    assert any("build tag" in p for p in found) and any(p.startswith("missing:") for p in found)


def test_artifact_holding_another_build(matrix, artifacts):
    a = artifacts / "wheels-linux-sageattention-pytorch27-cu128-python310"
    b = artifacts / "wheels-linux-sageattention-pytorch27-cu128-python311"
    wa, wb = next(a.iterdir()), next(b.iterdir())
    wa.rename(b / wa.name)
    wb.rename(a / wb.name)
    assert sum("holds" in p for p in problems(matrix, artifacts)) == 2


def test_repaired_linux_name_is_accepted(matrix, artifacts):
    wheel = next(artifacts.glob("wheels-linux-sageattention-pytorch28-cu129-python312/*.whl"))
    wheel.rename(wheel.with_name(wheel.name.replace("linux_x86_64", "manylinux_2_28_x86_64")))
    assert release.check_release(matrix, artifacts, PROFILES).passed


def test_tag_must_match_the_version(matrix, artifacts):
    assert any("does not match" in p for p in problems(matrix, artifacts, tag="v9.9.9"))


def test_existing_assets_are_never_replaced(matrix, artifacts, tmp_path, capsys):
    name = next(artifacts.glob("wheels-*/*.whl")).name
    assert any("already a release asset" in p for p in problems(matrix, artifacts, existing=[name]))
    listing = tmp_path / "existing.txt"
    listing.write_text(f"{name}\n", encoding="utf-8")
    out = tmp_path / "release"
    code = cli.main(
        ["release-check", str(artifacts), "--profile", "sage2-all", "--profile", "sage3-all"]
        + ["--existing-assets", str(listing), "--collect", str(out)]
    )
    assert code == 1 and not out.exists()
    assert "✗" in capsys.readouterr().out


def test_an_existing_sha256sums_is_never_replaced(matrix, artifacts, tmp_path, capsys):
    """A release that already has a SHA256SUMS (e.g. a re-run after a partial upload) stops at the
    check, before anything is uploaded, not half-way through the upload."""
    listing = tmp_path / "existing.txt"
    listing.write_text("SHA256SUMS\n", encoding="utf-8")
    out = tmp_path / "release"
    code = cli.main(
        ["release-check", str(artifacts), "--profile", "sage2-all sage3-all", "--tag", tag(matrix)]
        + ["--existing-assets", str(listing), "--collect", str(out), "--sha256sums", str(out / "SHA256SUMS")]
    )
    assert code == 1 and not out.exists()
    assert "SHA256SUMS is already a release asset" in capsys.readouterr().out
    # without --sha256sums nothing publishes a file of that name, so it does not collide
    assert release.check_release(matrix, artifacts, PROFILES, existing=["SHA256SUMS"]).passed


def test_collect_refuses_a_non_empty_folder(matrix, artifacts, tmp_path):
    out = tmp_path / "release"
    out.mkdir()
    (out / "old.whl").write_bytes(b"")
    assert (
        cli.main(["release-check", str(artifacts), "--profile", "sage2-all sage3-all", "--collect", str(out)])
        == 2
    )
