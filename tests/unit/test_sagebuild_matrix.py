"""build-matrix.yaml: profile counts, arch rules, rejected combinations and their reasons."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from sagebuild.errors import MatrixError
from sagebuild.matrix import REPO_ROOT, Arch, Matrix, load, parse_arch_list, read_build_requires

# Builds per platform of the release profiles, as the CI/CD documentation counts them.
RELEASE_COUNTS = {
    "default": 1,
    "stable": 3,
    "pytorch26": 4,
    "pytorch27": 3,
    "pytorch28": 3,
    "python310": 3,
    "python311": 3,
    "python312": 3,
    "sage2-all": 10,
}


@pytest.fixture(scope="module")
def matrix() -> Matrix:
    return load()


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load((REPO_ROOT / "build-matrix.yaml").read_text(encoding="utf-8"))


def rebuilt(raw: dict, edit) -> Matrix:
    data = copy.deepcopy(raw)
    edit(data)
    return Matrix(data, root=REPO_ROOT)


@pytest.mark.parametrize("profile,count", sorted(RELEASE_COUNTS.items()))
@pytest.mark.parametrize("platform", ["linux", "windows", "linux-aarch64"])
def test_release_profile_counts(matrix, profile, count, platform):
    assert len(matrix.profile_targets(profile, platform=platform)) == count


def test_release_profiles_contents(matrix):
    ids = [t.id for t in matrix.profile_targets("default", platform="linux")]
    assert ids == ["linux-sageattention-abi3-cu130-python312"]
    stable = {(t.torch, t.cuda, t.python) for t in matrix.profile_targets("stable", platform="linux")}
    assert stable == {("2.6.0", "12.6", "3.12"), ("2.7.0", "12.8", "3.12"), ("2.8.0", "12.9", "3.12")}
    py26 = [t.python for t in matrix.profile_targets("pytorch26", platform="windows")]
    assert py26 == ["3.9", "3.10", "3.11", "3.12"]
    every = matrix.profile_targets("sage2-all")
    assert len(every) == 30 and {t.platform for t in every} == {"linux", "windows", "linux-aarch64"}


def test_release_wheel_names(matrix):
    names = {t.wheel_name for t in matrix.profile_targets("sage2-all")}
    assert "sageattention-2.2.0-280.129-cp312-cp312-linux_x86_64.whl" in names
    assert "sageattention-2.2.0-260.126-cp39-cp39-win_amd64.whl" in names
    assert "sageattention-2.2.0-270.128-cp311-cp311-linux_x86_64.whl" in names


def test_sage3_profile(matrix):
    targets = matrix.profile_targets("sage3-all", platform="linux")
    assert {(t.torch, t.cuda) for t in targets} == {
        ("2.9.0", "12.8"),
        ("2.9.0", "13.0"),
        ("2.14.1", "12.8"),
        ("2.14.1", "13.0"),
    }
    assert all(t.python == "3.12" and t.archs == ("10.0a", "12.0a") for t in targets)
    assert "sageattn3-1.0.0+cu128torch2.9.0-cp312-cp312-linux_x86_64.whl" in {t.wheel_name for t in targets}


def test_new_releases_present(matrix):
    assert "2.14.1" in matrix.torch
    latest = matrix.profile_targets("latest", platform="linux")
    assert [t.wheel_name for t in latest] == ["sageattention-2.2.0-2141.130-cp312-cp312-linux_x86_64.whl"]
    assert len(matrix.profile_targets("pytorch214", platform="linux")) == 10
    ci = matrix.profile_targets("ci-build")
    assert [t.id for t in ci] == ["linux-sageattention-abi3-cu130-python311-sm90a"]


def test_ids_unique_and_findable(matrix):
    targets = matrix.all_targets()
    assert len({t.id for t in targets}) == len(targets)
    assert matrix.find_target("linux-sageattention-pytorch28-cu129-python312").torch == "2.8.0"
    special = matrix.find_target("linux-sageattention-pytorch2141-cu130-python311-sm80-sm90a")
    assert special.archs == ("8.0", "9.0a")
    with pytest.raises(MatrixError, match="unknown build id"):
        matrix.find_target("linux-sageattention-pytorch99-cu129-python312")


def test_default_archs_follow_cuda(matrix):
    cu126 = matrix.make_target("sageattention", "linux", "2.6.0", "12.6", "3.12")
    assert cu126.archs == ("8.0", "8.6", "8.9", "9.0a") and cu126.dropped_archs == ("12.0a",)
    cu129 = matrix.make_target("sageattention", "linux", "2.8.0", "12.9", "3.12")
    assert cu129.archs == ("8.0", "8.6", "8.9", "9.0a", "12.0a")


@pytest.mark.parametrize(
    "combo,reason",
    [
        (
            ("sageattention", "linux", "2.8.0", "13.0", "3.12"),
            r"has no CUDA 13.0 build; it ships CUDA 12.6, 12.8, 12.9",
        ),
        (
            ("sageattention", "linux", "2.9.0", "12.8", "3.9"),
            r"no wheels for Python 3.9; it supports Python 3.10",
        ),
        (
            ("sageattention", "linux", "2.5.0", "12.4", "3.12"),
            r"PyTorch 2.5.0 is not in .*known releases: 2.6.0",
        ),
        (
            ("sageattention", "macos", "2.8.0", "12.9", "3.12"),
            r"unknown platform 'macos'; valid: linux, windows, linux-aarch64",
        ),
        (
            ("sageattention", "linux-aarch64", "2.8.0", "12.8", "3.12"),
            r"PyTorch 2.8.0 has no CUDA 12.8 build for linux-aarch64; there it ships CUDA 12.9",
        ),
        (
            ("sageattention", "linux-aarch64", "2.14.1", "12.8", "3.12"),
            r"PyTorch 2.14.1 has no CUDA 12.8 build for linux-aarch64; there it ships CUDA 13.0",
        ),
        (("sageattn3", "linux", "2.8.0", "12.9", "3.12"), r"sageattn3 needs PyTorch >= 2.9.0"),
        (("flashattn", "linux", "2.8.0", "12.9", "3.12"), r"unknown package 'flashattn'"),
    ],
)
def test_invalid_combinations_say_why(matrix, combo, reason):
    with pytest.raises(MatrixError, match=reason):
        matrix.make_target(*combo)


@pytest.mark.parametrize(
    "cuda,archs,reason",
    [
        ("12.6", "12.0a", r"12.0a needs CUDA >= 12.8.*Valid for CUDA 12.6: 8.0, 8.6, 8.9, 9.0a"),
        ("12.9", "9.0", r"9.0 is not a sageattention arch \(did you mean 9.0a\?"),
        ("13.0", "7.0", r"7.0 is not a sageattention arch"),
        ("12.9", "9.0+PTX", r"\+PTX is not built"),
        ("12.9", "ninety", r"not of the form"),
    ],
)
def test_invalid_arch_lists_say_why(matrix, cuda, archs, reason):
    with pytest.raises(MatrixError, match=reason):
        matrix.resolve_archs("sageattention", cuda, archs)


def test_cuda13_has_no_arch_below_75(matrix):
    for version, release in matrix.cuda.items():
        if version.startswith("13."):
            assert min(Arch.parse(a).number for a in release.archs) == 75
    assert "dropped 7.0" in matrix.why_cuda_cannot("7.0", "13.0")
    assert matrix.min_cuda_for("12.0a") == "12.8"


def test_optional_arch_accepted_when_asked(matrix):
    archs, _, default = matrix.resolve_archs("sageattention", "12.8", "9.0a;10.0a")
    assert archs == ("9.0a", "10.0a") and not default


def test_sm121_build_holds_every_module_but_sm90(matrix):
    """12.1a (sm121) on request: the mma.sync kernels (sm80, sm89 families) and the fused quantization
    get its SASS; an arch-specific 12.0a build would not load there."""
    archs, _, default = matrix.resolve_archs("sageattention", "12.9", "12.1a")
    assert archs == ("12.1a",) and not default
    plans = {p.name: p for p in matrix.extension_plan("sageattention", archs)}
    for name in ("_fused", "_qattn_sm80", "_qattn_sm89"):
        assert plans[f"sageattention.{name}"].archs == ("12.1a",), name
    assert plans["sageattention._qattn_sm90"].skipped


def test_arch_parsing():
    assert parse_arch_list("9.0a;8.0 8.9,8.0") == ["8.0", "8.9", "9.0a"]
    arch = Arch.parse("12.0a")
    assert (arch.sm, arch.compute, arch.gencode) == (
        "sm_120a",
        "compute_120a",
        "-gencode=arch=compute_120a,code=sm_120a",
    )
    assert Arch.parse("sm_90a").name == "9.0a"


def test_extension_plan_filters_archs(matrix, tmp_path):
    archs = ("8.0", "8.9", "9.0a", "12.0a")
    plans = {p.name: p for p in matrix.extension_plan("sageattention", archs)}
    assert plans["sageattention._fused"].archs == archs
    assert plans["sageattention._qattn_sm80"].archs == archs
    assert plans["sageattention._qattn_sm89"].archs == ("8.9", "9.0a", "12.0a")
    assert plans["sageattention._qattn_sm90"].archs == ("9.0a",)
    only80 = {p.name: p for p in matrix.extension_plan("sageattention", ["8.0"])}
    assert "no requested arch" in only80["sageattention._qattn_sm90"].skipped
    # with a source tree: only the families that have kernels are built
    (tmp_path / "csrc" / "sm90").mkdir(parents=True)
    (tmp_path / "csrc" / "sm90" / "k.cu").write_text("")
    (tmp_path / "csrc" / "bindings.cpp").write_text("")
    built = {p.name: p for p in matrix.extension_plan("sageattention", archs, tmp_path)}
    assert built["sageattention._qattn_sm90"].sources == ("csrc/sm90/k.cu", "csrc/bindings.cpp")
    assert built["sageattention._qattn_sm90"].define == {"SAGEATTN_FAMILY_SM90": "1"}
    assert "match nothing" in built["sageattention._fused"].skipped


def test_bad_matrix_files_are_rejected_with_reasons(raw):
    with pytest.raises(MatrixError, match="lists CUDA 11.8, which has no entry"):
        rebuilt(raw, lambda d: d["torch"]["2.8.0"]["cuda"].append("11.8"))
    with pytest.raises(MatrixError, match="profile stable: unknown set 'nope'"):
        rebuilt(raw, lambda d: d["profiles"]["stable"].update(set="nope"))
    with pytest.raises(MatrixError, match="has no CUDA 13.0 build"):
        rebuilt(raw, lambda d: d["sets"]["sage2-release"]["builds"][0].update(cuda="13.0"))
    with pytest.raises(MatrixError, match="selects no builds"):
        rebuilt(raw, lambda d: d["profiles"]["default"].update(python=["3.13"]))
    with pytest.raises(MatrixError, match="must be MAJOR.MINOR"):
        rebuilt(raw, lambda d: d["cuda"].update({13: d["cuda"]["13.0"]}))  # unquoted YAML number


def test_ambiguous_release_in_matrix_is_rejected(raw):
    """2.1.41 and 2.14.1 would both encode as 2141: the matrix refuses to hold both."""

    def add(data):
        data["torch"]["2.1.41"] = copy.deepcopy(data["torch"]["2.14.1"])

    with pytest.raises(MatrixError, match="ambiguous"):
        rebuilt(raw, add)


def test_pyproject_readers(tmp_path, monkeypatch):
    assert read_build_requires(REPO_ROOT / "pyproject.toml")[0].startswith("setuptools==")
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[build-system]\nrequires = [\n  "setuptools==80.9.0",  # pinned\n  "PyYAML==6.0.3",\n]\n'
        '[project]\nname = "x"\nversion = "1.2.3"\n'
    )
    import builtins

    real_import = builtins.__import__

    def no_tomllib(name, *args, **kwargs):  # what Python 3.9 and 3.10 see
        if name == "tomllib":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tomllib)
    from sagebuild.matrix import read_project_version

    assert read_build_requires(pyproject) == ["setuptools==80.9.0", "PyYAML==6.0.3"]
    assert read_project_version(pyproject) == "1.2.3"


def test_package_version_comes_from_pyproject(matrix):
    text = (REPO_ROOT / "pyproject.toml").read_text()
    assert f'version = "{matrix.package_version("sageattention")}"' in text
    assert matrix.package_version("sageattn3") == "1.0.0"  # planned, until its pyproject exists
    assert Path(REPO_ROOT / "build-matrix.yaml").is_file()


def test_every_package_pins_its_build_environment(matrix):
    """Each package's [build-system] requires is exact pins (sagebuild installs exactly those), at the
    same versions as the root package's: sageattn3's build environment is as fixed as sageattention's."""
    from packaging.requirements import Requirement

    root = {}
    for text in read_build_requires(REPO_ROOT / "pyproject.toml"):
        req = Requirement(text)
        root[req.name] = str(req.specifier)
    for package in matrix.packages.values():
        pyproject = REPO_ROOT / package.source_dir / "pyproject.toml"
        requires = read_build_requires(pyproject)
        assert requires, f"{pyproject}: no [build-system] requires"
        for text in requires:
            req = Requirement(text)
            spec = list(req.specifier)
            assert len(spec) == 1 and spec[0].operator == "==", f"{pyproject}: {text} is not an exact pin"
            assert root.get(req.name, str(req.specifier)) == str(req.specifier), (
                f"{pyproject}: {text}, but the root pyproject.toml pins {req.name}{root[req.name]}"
            )
        assert any(Requirement(t).name == "setuptools" for t in requires)


def test_sageattn3_cuda_versions_left_out_say_why(matrix):
    """Seed 000's CUDA 12.9 and 13.1 are not built for sageattn3 (no torch of the set ships them): the
    matrix says why for each, and BUILD_MATRIX.md shows it."""
    from sagebuild import docs

    dropped = {combo for combo, _ in matrix.set_dropped("sage3")}
    assert dropped == {(t, c, "3.12") for t in ("2.9.0", "2.14.1") for c in ("12.9", "13.1")}
    notes = {tuple(n["cuda"]): n for n in matrix.left_out("sage3")}
    assert set(notes) == {("12.9",), ("13.1",)}
    for cuda, note in notes.items():
        assert {c for c in note["combos"]} == {c for c in dropped if c[1] == cuda[0]}
        assert note["why"].startswith("Seed 000 lists CUDA " + cuda[0])
    text = docs.render(matrix)
    section = text[text.index("## Left out of the build sets") : text.index("## Profiles")]
    for cuda in ("12.9", "13.1"):
        row = next(line for line in section.splitlines() if f"CUDA {cuda};" in line)
        assert "`sage3`" in row and "sageattn3" in row and f"has no CUDA {cuda} build" in row
        assert notes[(cuda,)]["why"] in row
    # no set leaves anything out without a note (validation would have refused the matrix)
    for name in matrix.sets:
        explained = {c for n in matrix.left_out(name) for c in n["combos"]}
        assert {c for c, _ in matrix.set_dropped(name)} <= explained


def test_a_combination_left_out_without_a_word_is_refused(matrix):
    def no_note(data):
        data["sets"]["sage3"]["left_out"] = data["sets"]["sage3"]["left_out"][:1]

    with pytest.raises(
        MatrixError, match=r"only_shipped leaves out torch 2\.9\.0 \+ CUDA 13\.1 \+ Python 3\.12"
    ):
        rebuilt(matrix.raw, no_note)

    def stale(data):
        data["sets"]["sage3"]["left_out"].append({"cuda": "12.4", "why": "old"})

    with pytest.raises(MatrixError, match="left_out note for cuda 12.4 matches no combination"):
        rebuilt(matrix.raw, stale)

    def no_why(data):
        data["sets"]["sage3"]["left_out"][0]["why"] = ""

    with pytest.raises(MatrixError, match="left_out note for cuda 12.9 gives no why"):
        rebuilt(matrix.raw, no_why)


# ----------------------------------------------------------------------------------------------------
# linux-aarch64: what PyTorch publishes there is data (platform_cuda), and so is what is left out


def test_aarch64_builds_what_pytorch_publishes_there(matrix):
    arm = matrix.platforms["linux-aarch64"]
    assert (arm.system, arm.wheel_platform, arm.repair_platform) == (
        "Linux",
        "linux_aarch64",
        "manylinux_2_28_aarch64",
    )
    assert arm.runner == "ubuntu-24.04-arm" and arm.docker_platform == "linux/arm64"
    abi3 = {t.cuda: t for t in matrix.profile_targets("abi3-release", platform="linux-aarch64")}
    assert {c: (t.torch, t.id, t.wheel_name) for c, t in abi3.items()} == {
        "13.0": (
            "2.14.1",
            "linux-aarch64-sageattention-abi3-cu130-python312",
            "sageattention-2.2.0-cp310-abi3-linux_aarch64.whl",
        ),
        # 2.14.1 has no aarch64 CUDA 12.8 build: the CUDA 12 line is built with 2.11.0
        "12.8": (
            "2.11.0",
            "linux-aarch64-sageattention-abi3-cu128-python312",
            "sageattention-2.2.0+cu12-cp310-abi3-linux_aarch64.whl",
        ),
    }
    # the x86_64 builds of the set are unchanged by the aarch64-only entry
    assert {t.torch for t in matrix.profile_targets("abi3-release", platform="linux")} == {"2.14.1"}
    assert matrix.torch["2.8.0"].cuda_on("linux-aarch64") == ("12.9",)
    assert matrix.torch["2.8.0"].cuda_on("linux") == ("12.6", "12.8", "12.9")
    release = {(t.torch, t.cuda) for t in matrix.profile_targets("release-cu128", platform="linux-aarch64")}
    assert release == {("2.7.0", "12.8"), ("2.9.0", "12.8")}  # no aarch64 CUDA 12.8 build of 2.8.0
    current = matrix.profile_targets("pytorch214", platform="linux-aarch64")
    assert {t.cuda for t in current} == {"13.0"} and len(current) == 5
    assert matrix.torch["2.14.1"].registry_cuda["linux-aarch64"] == "13.0"
    assert matrix.torch["2.10.0"].registry_cuda["linux-aarch64"] is None


def test_aarch64_gaps_are_explained_and_rendered(matrix):
    from sagebuild import docs

    notes = matrix.platform_left_out("linux-aarch64")
    explained = {(name, combo) for note in notes for name, combo in note["combos"]}
    assert ("sage2-release-cu128", ("2.8.0", "12.8", "3.12")) in explained
    assert ("sage2-abi3", ("2.14.1", "12.8", "3.12")) in explained
    assert {c[0] for n, c in explained if n == "sage2-current"} == {"2.12.1", "2.13.0", "2.14.1"}
    for name in matrix.sets:  # every gap of every set has its note
        gaps = {(name, combo) for combo, _ in matrix.platform_dropped(name, "linux-aarch64")}
        assert gaps <= explained
    assert matrix.platform_left_out("linux") == [] and matrix.platform_dropped("sage2-abi3", "linux") == []
    text = docs.render(matrix)
    section = text[text.index("## Left out of the build sets") : text.index("## Profiles")]
    row = next(line for line in section.splitlines() if line.startswith("| `sage2-abi3` |"))
    assert "| linux-aarch64 |" in row and "PyTorch 2.14.1; CUDA 12.8; Python 3.11, 3.12" in row
    assert "has no CUDA 12.8 build for linux-aarch64 (it ships 13.0 there)" in row
    assert "| 2.8.0 | `280` | 12.6, 12.8, 12.9 (linux-aarch64: 12.9) |" in text


def test_aarch64_gaps_without_a_word_are_refused(raw):
    def no_note(data):
        data["platforms"]["linux-aarch64"]["left_out"] = data["platforms"]["linux-aarch64"]["left_out"][:1]

    with pytest.raises(
        MatrixError,
        match=r"set sage2-abi3: linux-aarch64 lacks torch 2\.14\.1 \+ CUDA 12\.8 \+ Python 3\.11 .*"
        r"add a left_out note under platforms\.linux-aarch64",
    ):
        rebuilt(raw, no_note)

    def stale(data):
        data["platforms"]["linux-aarch64"]["left_out"].append({"torch": "2.6.0", "why": "old"})

    with pytest.raises(
        MatrixError, match="platform linux-aarch64: the left_out note for torch 2.6.0 matches no"
    ):
        rebuilt(raw, stale)

    def not_a_build(data):
        data["torch"]["2.6.0"]["platform_cuda"]["linux-aarch64"] = ["12.6", "12.8"]

    with pytest.raises(
        MatrixError, match=r"platform_cuda gives linux-aarch64 CUDA 12\.8, which is not among"
    ):
        rebuilt(raw, not_a_build)

    def wrong_plain_index(data):
        data["torch"]["2.14.1"]["registry_cuda"]["linux-aarch64"] = "12.8"

    with pytest.raises(
        MatrixError, match=r"CUDA 12\.8 on linux-aarch64, which is not one of its CUDA builds"
    ):
        rebuilt(raw, wrong_plain_index)

    def unknown(data):
        data["cuda"]["13.0"]["pip"]["platforms"] = ["linux", "linux-riscv64"]
        data["sets"]["sage2-abi3"]["builds"][1]["platforms"] = ["linux-arm"]

    with pytest.raises(MatrixError, match="pip.platforms names unknown platform 'linux-riscv64'") as err:
        rebuilt(raw, unknown)
    assert "a build entry names unknown platform 'linux-arm'" in str(err.value)


def test_aarch64_toolkits_come_from_where_the_matrix_says(matrix, raw):
    """The CUDA 13 pip packages have aarch64 wheels (pip: platforms): sagebuild installs them there as
    on x86_64; CUDA 12 has no nvcc on the index, so the installer; a platform the packages do not list
    gets the installer too."""
    from sagebuild import ci

    cu13 = matrix.find_target("linux-aarch64-sageattention-abi3-cu130-python312")
    cu12 = matrix.find_target("linux-aarch64-sageattention-abi3-cu128-python312")
    assert ci.toolkit_plan(matrix, cu13).source == "pip"
    plan = ci.toolkit_plan(matrix, cu12)
    assert plan.source == "installer" and plan.release == "12.8.1" and "nvcc" in plan.sub_packages

    def x86_only(data):
        data["cuda"]["13.0"]["pip"]["platforms"] = ["linux", "windows"]

    narrowed = rebuilt(raw, x86_only)
    plan = ci.toolkit_plan(narrowed, narrowed.find_target(cu13.id))
    assert plan.source == "installer" and "no CUDA 13.0 toolkit packages for linux-aarch64" in plan.reason
    assert (
        ci.toolkit_plan(narrowed, narrowed.find_target("linux-sageattention-abi3-cu130-python312")).source
        == "pip"
    )
