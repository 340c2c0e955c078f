"""Builds that are killed, fail or run twice: what sagebuild leaves behind, and what the next build does.

* Interrupted builds: a build killed at any step (here: SIGKILL in the compile and in the copy to the
  output folder) leaves no wheel under its name in the output folder; the next build finds the dead
  build's claim on the work folder, clears it and starts over, and sweeps the half-written copy. Cached
  environments and toolkits are reused only when complete (their marker is written last, atomically)
  and working; stale ``build/`` trees and in-place binaries never reach a build.
* Only a verified wheel reaches the output folder, and it gets there by an atomic rename.
* Reproducibility: SOURCE_DATE_EPOCH comes from the environment, the last commit or a fixed default;
  two builds of one source are byte-identical; ``sagebuild diff`` names what differs and says which
  differences builds may show (compiled objects).

Everything runs with stand-ins for the slow steps (no compiler, no network); the pure-Python build
through the real frontend, twice, is in tests/build/test_wheel_build.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types
import zipfile
from pathlib import Path

import pytest
from wheel.wheelfile import WheelFile

from sagebuild import build as sb
from sagebuild import cli, envs
from sagebuild.errors import SagebuildError
from sagebuild.matrix import REPO_ROOT, load
from sagebuild.verify import compare_wheels

MATRIX = load()
VERSION = MATRIX.package_version("sageattention")
PURE = f"sageattention-{VERSION}-py3-none-any.whl"
EPOCH = 1700000000  # 2023-11-14 22:13:20 UTC

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="uses SIGKILL and /proc")


def write_wheel(path: Path, files: dict[str, bytes], requires: str = "torch>=2.4") -> Path:
    """A pure wheel as setuptools would write it (time stamps from SOURCE_DATE_EPOCH when set)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with WheelFile(str(path), "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        meta = (
            f"Metadata-Version: 2.4\nName: sageattention\nVersion: {VERSION}\nRequires-Dist: {requires}\n\n"
        )
        wheel.writestr(f"{wheel.dist_info_path}/METADATA", meta)
        info = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        wheel.writestr(f"{wheel.dist_info_path}/WHEEL", info)
    return path


def dead_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def progress():
    """Progress lines written to whatever sys.stdout is when they are written (capsys sees them)."""
    stream = types.SimpleNamespace(
        write=lambda text: sys.stdout.write(text), flush=lambda: sys.stdout.flush()
    )
    return envs.Progress(stream)


@pytest.fixture
def epoch(monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(EPOCH))
    return EPOCH


# --------------------------------------------------------------------------------------------------
# The whole build, killed midway (in a child process, SIGKILL), then run again

CHILD = """
import os, shutil, sys, time
from pathlib import Path
from sagebuild import build as sb
from sagebuild.matrix import load

cache, out, flag, when = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
name = sys.argv[5]

def compile_wheel(package, target, python, staged, cuda_home, work, progress, **kw):
    (staged / "build" / "temp").mkdir(parents=True)
    (staged / "build" / "temp" / "kernel.o").write_bytes(b"half an object file")
    (work / "dist").mkdir(exist_ok=True)
    wheel = work / "dist" / name
    if when == "compile":
        wheel.write_bytes(b"PK\\x03\\x04 half a wheel")
        flag.write_text("stuck in the compile")
        time.sleep(600)
    shutil.copy(sys.argv[6], wheel)
    return wheel

def copy2(src, dst):  # the copy into the output folder, killed halfway
    data = Path(src).read_bytes()
    Path(dst).write_bytes(data[: len(data) // 2])
    flag.write_text("stuck in the copy")
    time.sleep(600)

real_publish = sb.publish

def publish(wheel, out, progress):
    sb.shutil.copy2 = copy2
    return real_publish(wheel, out, progress)

sb.compile_wheel = compile_wheel
sb.publish = publish
sb.build(load(), sb.BuildOptions(out=out, cache=cache, use_current_env=True, smoke=False))
"""


def good_compile(source: Path):
    def compile_wheel(package, target, python, staged, cuda_home, work, progress, **kw):
        assert not (staged / "build").exists(), "a stale build tree reached the compile"
        (work / "dist").mkdir(exist_ok=True)
        return Path(shutil.copy(source, work / "dist" / source.name))

    return compile_wheel


@posix_only
@pytest.mark.parametrize("when", ["compile", "copy"])
def test_killed_build_leaves_no_wheel_and_the_next_build_starts_over(tmp_path, monkeypatch, capsys, when):
    cache, out, flag = tmp_path / "cache", tmp_path / "wheelhouse", tmp_path / "flag"
    good = write_wheel(tmp_path / "good" / PURE, {"sageattention/__init__.py": b"x = 1\n"})
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(cache), str(out), str(flag), when, PURE, str(good)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not flag.exists():
            assert child.poll() is None, "the build ended before it got stuck"
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    work = cache / "work" / "sageattention-pure"
    assert (work / sb.CLAIM_FILE).is_file(), "a killed build leaves its claim"
    assert not (out / PURE).exists(), "a killed build must leave no wheel under the wheel's name"
    if when == "copy":
        assert [p.name for p in out.iterdir()] == [f".{PURE}.{child.pid}{sb.PARTIAL_SUFFIX}"]

    monkeypatch.setattr(sb, "compile_wheel", good_compile(good))
    final = sb.build(MATRIX, sb.BuildOptions(out=out, cache=cache, use_current_env=True, smoke=False))
    said = capsys.readouterr().out
    assert f"a build of sageattention-pure was interrupted here (pid {child.pid}" in said
    assert final == out / PURE and final.read_bytes() == good.read_bytes()
    assert sorted(p.name for p in out.iterdir()) == [PURE], "the half-written copy is swept"
    assert not (work / sb.CLAIM_FILE).exists()
    if when == "copy":
        assert f"removing .{PURE}.{child.pid}{sb.PARTIAL_SUFFIX}" in said


def test_an_unverified_wheel_never_reaches_the_output_folder(tmp_path, monkeypatch):
    bad = write_wheel(tmp_path / "bad" / PURE, {"sageattention/__init__.py": b""}, requires="torch==2.8.0")
    monkeypatch.setattr(sb, "compile_wheel", good_compile(bad))
    out = tmp_path / "wheelhouse"
    options = sb.BuildOptions(out=out, cache=tmp_path / "cache", use_current_env=True, smoke=False)
    with pytest.raises(SagebuildError, match=f"{PURE} failed verification: it was not copied to"):
        sb.build(MATRIX, options)
    assert not out.exists() or not list(out.iterdir())
    assert not (tmp_path / "cache" / "work" / "sageattention-pure" / sb.CLAIM_FILE).exists()


# --------------------------------------------------------------------------------------------------
# The work folder's claim


def test_claim_of_a_dead_build_clears_the_work_folder(tmp_path, progress, capsys):
    work = tmp_path / "work"
    (work / "src" / "build").mkdir(parents=True)
    (work / "src" / "build" / "stale.o").write_bytes(b"")
    (work / "dist").mkdir()
    (work / "dist" / PURE).write_bytes(b"PK half")
    envs.write_marker(work / sb.CLAIM_FILE, {"pid": dead_pid(), "host": sb.socket.gethostname()})
    with sb.claimed(work, "x", progress) as claim:
        assert sorted(p.name for p in work.iterdir()) == [sb.CLAIM_FILE]
        assert json.loads(claim.read_text())["pid"] == os.getpid()
    assert not work.joinpath(sb.CLAIM_FILE).exists()
    assert "was interrupted here" in capsys.readouterr().out


def test_claim_released_when_the_build_fails(tmp_path, progress):
    work = tmp_path / "work"
    with pytest.raises(RuntimeError), sb.claimed(work, "x", progress):
        (work / "build.log").write_text("the compiler said no")
        raise RuntimeError("compile failed")
    assert not (work / sb.CLAIM_FILE).exists()
    assert (work / "build.log").is_file(), "a failed build's log stays to be read"


@posix_only
def test_claim_of_a_running_build_stops_a_second_one(tmp_path, progress):
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        held = {
            "pid": other.pid,
            "host": sb.socket.gethostname(),
            "process_start": sb.process_start(other.pid),
        }
        envs.write_marker(work / sb.CLAIM_FILE, held)
        with pytest.raises(SagebuildError, match=f"another build of x is running in .* \\(pid {other.pid}"):
            with sb.claimed(work, "x", progress):
                pass
        assert (work / "src").is_dir(), "a running build's folder is left alone"
        # the same pid, but a process started at another time: the pid was reused, the build is dead
        if held["process_start"] is not None:
            envs.write_marker(work / sb.CLAIM_FILE, {**held, "process_start": "1"})
            with sb.claimed(work, "x", progress):
                assert not (work / "src").exists()
    finally:
        other.kill()
        other.wait()


def test_claim_from_another_host_is_not_guessed_at(tmp_path, progress):
    work = tmp_path / "work"
    work.mkdir()
    envs.write_marker(work / sb.CLAIM_FILE, {"pid": 1, "host": "some-other-machine"})
    with pytest.raises(SagebuildError, match="claimed by a build on some-other-machine.*delete"):
        with sb.claimed(work, "x", progress):
            pass


def test_two_claims_at_once(tmp_path, progress):
    work = tmp_path / "work"
    with sb.claimed(work, "x", progress):
        with pytest.raises(SagebuildError, match="just now"):
            sb._create_claim(work / sb.CLAIM_FILE, {"pid": 2}, "x")


# --------------------------------------------------------------------------------------------------
# The output folder: atomic copies, sweeping what interrupted copies left


def test_publish_replaces_the_wheel_in_one_step(tmp_path, progress):
    out = tmp_path / "out"
    out.mkdir()
    (out / PURE).write_bytes(b"the previous build's wheel")
    new = write_wheel(tmp_path / "new" / PURE, {"sageattention/__init__.py": b""})
    renames = []
    real_replace = os.replace

    def replace(src, dst):
        renames.append((Path(src).name, Path(dst).name, (out / PURE).read_bytes()))
        real_replace(src, dst)

    sb.os.replace, saved = replace, sb.os.replace
    try:
        final = sb.publish(new, out, progress)
    finally:
        sb.os.replace = saved
    assert final.read_bytes() == new.read_bytes()
    [(src, dst, before)] = renames
    assert src == f".{PURE}.{os.getpid()}{sb.PARTIAL_SUFFIX}" and dst == PURE
    assert before == b"the previous build's wheel", "the old wheel stays whole until the rename"
    assert sorted(p.name for p in out.iterdir()) == [PURE]


def test_publish_refuses_a_copy_that_differs(tmp_path, progress, monkeypatch):
    new = write_wheel(tmp_path / "new" / PURE, {"sageattention/__init__.py": b""})
    monkeypatch.setattr(sb.shutil, "copy2", lambda src, dst: Path(dst).write_bytes(b"PK short"))
    with pytest.raises(SagebuildError, match="differs from the built wheel"):
        sb.publish(new, tmp_path / "out", progress)
    assert list((tmp_path / "out").iterdir()) == []


def test_sweep_removes_only_what_interrupted_builds_left(tmp_path, progress):
    out = tmp_path / "out"
    out.mkdir()
    dead, live = dead_pid(), os.getpid()
    (out / f".{PURE}.{dead}{sb.PARTIAL_SUFFIX}").write_bytes(b"PK")
    (out / f".{PURE}.{live}{sb.PARTIAL_SUFFIX}").write_bytes(b"PK")  # a copy in progress
    (out / PURE).write_bytes(write_wheel(tmp_path / "w" / PURE, {"a.py": b""}).read_bytes()[:300])
    other = "sageattention-2.2.0-280.129-cp312-cp312-linux_x86_64.whl"
    (out / other).write_bytes(b"not ours to judge")
    sb.sweep_output(out, "sageattention", PURE, progress)
    assert sorted(p.name for p in out.iterdir()) == sorted([f".{PURE}.{live}{sb.PARTIAL_SUFFIX}", other])
    whole = write_wheel(out / PURE, {"a.py": b""})
    sb.sweep_output(out, "sageattention", PURE, progress)
    assert whole.is_file(), "a readable wheel is kept (the build replaces it when it succeeds)"


# --------------------------------------------------------------------------------------------------
# Cached environments and toolkits: complete, or made again


def _fake_venv_tools(monkeypatch, calls, fail_install=False):
    def create_venv(python, path, progress=None, with_pip=True):
        if path.exists():
            shutil.rmtree(path)
        exe = Path(envs.venv_python(path))
        exe.parent.mkdir(parents=True)
        exe.symlink_to(sys.executable)
        calls.append("create")
        return exe

    def pip(python, args, **kw):
        calls.append("pip " + args[0])
        if fail_install:
            raise SagebuildError("pip was killed")

    monkeypatch.setattr(envs, "create_venv", create_venv)
    monkeypatch.setattr(envs, "pip", pip)


def _env_options(tmp_path) -> sb.BuildOptions:
    return sb.BuildOptions(cache=tmp_path / "cache")


@posix_only
def test_an_environment_interrupted_while_made_is_made_again(tmp_path, monkeypatch, progress):
    package = MATRIX.package("sageattention")
    calls = []
    _fake_venv_tools(monkeypatch, calls, fail_install=True)
    with pytest.raises(SagebuildError, match="pip was killed"):
        sb.prepare_env(MATRIX, package, None, Path(sys.executable), _env_options(tmp_path), progress)
    venv = next((tmp_path / "cache" / "envs").iterdir())
    assert not (venv / "sagebuild-env.json").exists(), "no marker on an environment that is not complete"
    calls.clear()
    _fake_venv_tools(monkeypatch, calls)
    exe, _ = sb.prepare_env(MATRIX, package, None, Path(sys.executable), _env_options(tmp_path), progress)
    assert calls == ["create", "pip install"] and (venv / "sagebuild-env.json").is_file()
    calls.clear()
    sb.prepare_env(MATRIX, package, None, Path(sys.executable), _env_options(tmp_path), progress)
    assert calls == [], "a complete environment is reused"


@posix_only
def test_a_damaged_environment_is_made_again(tmp_path, monkeypatch, progress, capsys):
    package = MATRIX.package("sageattention")
    calls = []
    _fake_venv_tools(monkeypatch, calls)
    exe, _ = sb.prepare_env(MATRIX, package, None, Path(sys.executable), _env_options(tmp_path), progress)
    exe.unlink()
    exe.write_text("#!/bin/sh\nexit 1\n")  # an interpreter that no longer runs
    exe.chmod(0o755)
    calls.clear()
    sb.prepare_env(MATRIX, package, None, Path(sys.executable), _env_options(tmp_path), progress)
    assert calls == ["create", "pip install"]
    assert "is damaged" in capsys.readouterr().out


def test_a_marker_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    marker = tmp_path / "m.json"
    envs.write_marker(marker, {"complete": True})

    def killed(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(envs.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        envs.write_marker(marker, {"complete": False, "pad": "x" * 100000})
    assert envs.read_marker(marker) == {"complete": True}


def test_a_toolkit_interrupted_while_installed_is_installed_again(tmp_path, monkeypatch, progress):
    target = MATRIX.make_target("sageattention", "linux", "2.14.1", "13.0", "3.11", "9.0a")
    options = sb.BuildOptions(cache=tmp_path / "cache", toolkit="pip")
    release = MATRIX.cuda_release("13.0")
    folder = tmp_path / "cache" / "toolkits" / f"cuda-13.0-{target.platform}"
    (folder / "nvidia").mkdir(parents=True)
    (folder / "nvidia" / "half-unpacked.txt").write_text("")
    installs = []

    def pip(python, args, **kw):
        installs.append(args)
        assert not (folder / "nvidia" / "half-unpacked.txt").exists(), "the partial install is removed first"
        for root in release.pip.roots:
            (folder / root).mkdir(parents=True)

    monkeypatch.setattr(envs, "pip", pip)
    monkeypatch.setattr(envs, "finish_pip_toolkit", lambda home: None)
    monkeypatch.setattr(envs, "nvcc_version", lambda home: ("13.0", "13.0.88"))
    monkeypatch.setattr(envs, "detect_cuda_home", lambda: None)
    sb.prepare_toolkit(MATRIX, target, options, progress)
    assert len(installs) == 1
    sb.prepare_toolkit(MATRIX, target, options, progress)
    assert len(installs) == 1, "a complete toolkit is reused"


def test_stale_build_trees_and_binaries_never_reach_a_build(tmp_path, progress):
    root = tmp_path / "checkout"
    for path in ("setup.py", "pyproject.toml", "sageattention/__init__.py", "csrc/sm90/attn.cu"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("# source\n")
    stale = [
        "build/lib.linux-x86_64-cpython-311/sageattention/_fused.so",  # an old `setup.py build`
        "sageattention/_qattn_sm90.cpython-311-x86_64-linux-gnu.so",  # an in-place build
        "sageattention.egg-info/SOURCES.txt",
        "sageattention/__pycache__/core.cpython-311.pyc",
    ]
    for path in stale:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(b"stale")
    work = tmp_path / "work"
    (work / "src" / "build" / "temp").mkdir(parents=True)
    (work / "src" / "build" / "temp" / "kernel.o").write_bytes(b"from the interrupted build")
    matrix = types.SimpleNamespace(root=root)
    package = types.SimpleNamespace(name="sageattention", source_dir=".")
    staged = sb.stage_sources(matrix, package, work, progress)
    copied = sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file())
    assert copied == ["csrc/sm90/attn.cu", "pyproject.toml", "sageattention/__init__.py", "setup.py"]


# --------------------------------------------------------------------------------------------------
# Reproducibility: SOURCE_DATE_EPOCH, identical builds, `sagebuild diff`


def test_source_date_epoch_comes_from_the_environment_then_git_then_a_fixed_default(tmp_path):
    assert sb.source_date_epoch(tmp_path, {"SOURCE_DATE_EPOCH": "1234"}) == (1234, "from the environment")
    with pytest.raises(SagebuildError, match="SOURCE_DATE_EPOCH='yesterday'"):
        sb.source_date_epoch(tmp_path, {"SOURCE_DATE_EPOCH": "yesterday"})
    assert sb.source_date_epoch(tmp_path, {})[0] == sb.DEFAULT_SOURCE_DATE_EPOCH == 315532800
    if shutil.which("git") is None:
        pytest.skip("no git here")
    repo = tmp_path / "repo"
    repo.mkdir()
    when = {"GIT_AUTHOR_DATE": "@1600000000 +0000", "GIT_COMMITTER_DATE": "@1600000000 +0000"}
    git_env = {**os.environ, **when, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    for cmd in (
        ["init", "-q"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x"],
    ):
        subprocess.run(["git", "-C", str(repo), *cmd], check=True, env=git_env, capture_output=True)
    assert sb.source_date_epoch(repo, {}) == (1600000000, "the last commit's time")
    (repo / "sub").mkdir()
    assert sb.source_date_epoch(repo / "sub", {})[0] == sb.DEFAULT_SOURCE_DATE_EPOCH, "only a checkout's root"
    assert sb.source_date_epoch(REPO_ROOT, {})[1] in (
        "the last commit's time",
        sb.source_date_epoch(tmp_path, {})[1],
    )


def test_compile_passes_source_date_epoch(tmp_path, monkeypatch, progress):
    seen = {}

    def run(cmd, env=None, cwd=None, log_file=None, progress=None, capture=False, check=True):
        if capture:  # `import build`
            return subprocess.CompletedProcess(cmd, 0, "", "")
        seen.update(env)
        write_wheel(Path(cmd[cmd.index("--outdir") + 1]) / PURE, {})
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(envs, "run", run)
    package = MATRIX.package("sageattention")
    sb.compile_wheel(package, None, Path(sys.executable), tmp_path, None, tmp_path, progress, epoch=1234)
    assert seen["SOURCE_DATE_EPOCH"] == "1234" and seen["SAGEATTENTION_BUILD_CUDA"] == "0"


def test_two_builds_of_one_source_are_byte_identical(tmp_path, progress):
    """The pure-Python wheel through setuptools, twice, from copies of one source made at different
    times (so every file's mtime differs): the same bytes, every time stamp SOURCE_DATE_EPOCH."""
    package = MATRIX.package("sageattention")
    first = sb.stage_sources(MATRIX, package, tmp_path / "a", progress)
    second = tmp_path / "b" / "src"
    shutil.copytree(first, second)
    for path in second.rglob("*"):
        os.utime(path, (EPOCH + 12345, EPOCH + 12345))
    python = Path(sys.executable)
    wheels = []
    for staged in (first, second):
        wheel = sb.compile_wheel(package, None, python, staged, None, staged.parent, progress, False, EPOCH)
        wheels.append(wheel)
    diff = compare_wheels(*wheels)
    assert diff.identical_bytes, diff.render()
    with zipfile.ZipFile(wheels[0]) as archive:
        assert {info.date_time for info in archive.infolist()} == {(2023, 11, 14, 22, 13, 20)}


def _pair(tmp_path, a: dict[str, bytes], b: dict[str, bytes]) -> tuple[Path, Path]:
    return write_wheel(tmp_path / "a" / PURE, a), write_wheel(tmp_path / "b" / PURE, b)


SO_MEMBER = "sageattention/_fused.cpython-311-x86_64-linux-gnu.so"


def test_diff_identical(tmp_path, epoch, capsys):
    a, b = _pair(tmp_path, {"sageattention/x.py": b"1"}, {"sageattention/x.py": b"1"})
    assert cli.main(["diff", str(a), str(b)]) == 0
    assert "✓ byte-identical" in capsys.readouterr().out


def test_diff_compiled_objects_are_expected_to_differ(tmp_path, epoch, capsys):
    a, b = _pair(
        tmp_path,
        {"sageattention/x.py": b"1", SO_MEMBER: b"obj 1"},
        {"sageattention/x.py": b"1", SO_MEMBER: b"obj 2"},
    )
    assert cli.main(["diff", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert (
        f"~ {SO_MEMBER}: contents differ (5 / 5 bytes" in out
        and "a compiled object, expected to differ" in out
    )
    assert "~ sageattention-2.2.0.dist-info/RECORD: differs only in the hashes of compiled objects" in out
    assert "=> identical apart from compiled objects" in out
    assert cli.main(["diff", "--strict", str(a), str(b)]) == 1


def test_diff_reports_sources_members_and_time_stamps(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(EPOCH))
    a = write_wheel(tmp_path / "a" / PURE, {"sageattention/x.py": b"1", "sageattention/gone.py": b""})
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(EPOCH + 60))
    b = write_wheel(tmp_path / "b" / PURE, {"sageattention/x.py": b"22", "sageattention/new.py": b""})
    assert cli.main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    stamps = "time stamp 2023-11-14 22:13:20 / 2023-11-14 22:14:20"
    assert f"✗ sageattention/x.py: contents differ (1 / 2 bytes); {stamps}" in out
    assert "✗ sageattention/gone.py: only in A" in out and "✗ sageattention/new.py: only in B" in out
    assert "is SOURCE_DATE_EPOCH set?" in out and "=> DIFFERENT" in out
    diff = compare_wheels(a, b)
    assert {d.member for d in diff.unexpected} >= {"sageattention/x.py", "sageattention/gone.py"}


def test_diff_of_a_file_that_is_not_a_wheel(tmp_path, capsys):
    a = tmp_path / "a.whl"
    a.write_bytes(b"PK not really")
    b = tmp_path / "b.whl"
    b.write_bytes(b"PK not either")
    assert cli.main(["diff", str(a), str(b)]) == 1
    assert "not a readable wheel" in capsys.readouterr().err


def test_diff_help(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["diff", "--help"])
    assert info.value.code == 0
    assert "usage: python -m sagebuild diff" in capsys.readouterr().out
