"""The torch-independent wheels: one abi3 wheel per CUDA line serves every torch from the matrix's
floor on. Their targets and names (build-matrix.yaml, sagebuild.matrix / tags), how few a release
needs against the per-torch wheels, and the installed package's check that its CUDA line fits torch."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sageattention import _native
from sagebuild import tags
from sagebuild.errors import TagError
from sagebuild.matrix import load

MATRIX = load()


def parse(name: str):
    return tags.parse_wheel_name(
        name, MATRIX.torch, MATRIX.cuda, MATRIX.wheel_platforms(), MATRIX.naming(), MATRIX.abi3_entries()
    )


def test_a_release_for_every_torch_is_six_wheels_not_165():
    abi3 = MATRIX.profile_targets("abi3-release")
    per_torch = MATRIX.profile_targets("sage2-current")
    assert len(per_torch) == 165  # 60 linux, 60 windows, 45 linux-aarch64 (no aarch64 cu128 from 2.12)
    assert sorted(t.wheel_name for t in abi3) == [
        "sageattention-2.2.0+cu12-cp310-abi3-linux_aarch64.whl",
        "sageattention-2.2.0+cu12-cp310-abi3-linux_x86_64.whl",
        "sageattention-2.2.0+cu12-cp310-abi3-win_amd64.whl",
        "sageattention-2.2.0-cp310-abi3-linux_aarch64.whl",
        "sageattention-2.2.0-cp310-abi3-linux_x86_64.whl",
        "sageattention-2.2.0-cp310-abi3-win_amd64.whl",
    ]
    assert {t.naming for t in abi3} == {"abi3"} and {t.torch_floor for t in abi3} == {"2.6.0"}


def test_the_default_profile_builds_the_abi3_wheel_of_the_default_line():
    (linux,) = MATRIX.profile_targets("default", platform="linux")
    assert linux.naming == "abi3" and linux.local_version is None and linux.build_tag is None
    assert linux.wheel_tag == "cp310-abi3-linux_x86_64"
    assert tags.cuda_line(linux.cuda) == MATRIX.package("sageattention").abi3["default_line"]


@pytest.mark.parametrize(
    "filename,line,local",
    [
        ("sageattention-2.2.0-cp310-abi3-manylinux_2_28_x86_64.whl", "13", None),
        ("sageattention-2.2.0+cu12-cp310-abi3-manylinux_2_28_x86_64.whl", "12", "cu12"),
        ("sageattention-2.2.0+cu12-cp310-abi3-win_amd64.whl", "12", "cu12"),
        ("sageattention-2.2.0-cp310-abi3-manylinux_2_28_aarch64.whl", "13", None),
        ("sageattention-2.2.0+cu12-cp310-abi3-linux_aarch64.whl", "12", "cu12"),
    ],
)
def test_abi3_names_decode_to_their_cuda_line(filename, line, local):
    name = parse(filename)
    assert (name.kind, name.cuda, name.torch, name.python, name.build) == ("abi3", line, None, "3.10", None)
    assert (name.version.split("+")[1] if "+" in name.version else None) == local


def test_abi3_names_round_trip_through_the_targets():
    """Every platform's abi3 wheel, as built and as repaired (linux-aarch64: linux_aarch64 and
    manylinux_2_28_aarch64), decodes to its platform and CUDA line."""
    platforms = set()
    for target in MATRIX.profile_targets("abi3-release"):
        repair = MATRIX.platforms[target.platform].repair_platform
        built = [target] + ([replace(target, wheel_platform=repair)] if repair else [])
        for wheel in built:
            name = parse(wheel.wheel_name)
            assert name.cuda == tags.cuda_line(target.cuda) and name.platform == target.platform
            assert name.platform_tag == wheel.wheel_platform
        platforms.add(target.platform)
    assert platforms == set(MATRIX.platforms) and "linux-aarch64" in platforms


def test_a_per_torch_name_is_not_read_as_abi3():
    name = parse("sageattention-2.2.0-2141.130-cp312-cp312-linux_x86_64.whl")
    assert name.kind == "build-tag" and name.torch == "2.14.1"
    with pytest.raises(TagError, match="carries no"):
        parse("sageattention-2.2.0-2141.130-cp310-abi3-linux_x86_64.whl")


@pytest.mark.parametrize(
    "line,torch_cuda,fits",
    [("13", "13.0", True), ("13", "13.2", True), ("12", "12.6", True), ("13", "12.8", False),
     ("12", "13.0", False), ("13", None, True)],
)  # fmt: skip
def test_the_cuda_line_must_fit_torchs(line, torch_cuda, fits):
    """A wheel of one CUDA line beside a torch of another is refused (at import, with what to install);
    a torch without CUDA fits: the compiled kernels are never chosen there."""
    info = {"cuda_line": line, "nvcc": f"{line}.0.88"}
    problem = _native.cuda_line_problem(info, torch_cuda=torch_cuda or "")
    assert (problem is None) == fits
    if not fits:
        assert f"CUDA {line}.x" in problem and f"/cu{torch_cuda.split('.')[0]}" in problem


def test_a_source_tree_or_pure_wheel_has_no_line_to_check():
    assert _native.cuda_line_problem({}, torch_cuda="12.8") is None
    assert _native.cuda_line_problem({"cuda_line": None}, torch_cuda="12.8") is None


def test_descriptors_carry_what_the_c_side_reads():
    """csrc/bindings.cpp's View: data, dtype code, device type, index, dims, 4 sizes, 4 strides."""
    import torch

    x = torch.empty(2, 3, 4, 8, dtype=torch.bfloat16).transpose(1, 2)
    words = _native._descriptor(x)
    assert len(words) == _native.DESC_WORDS
    assert words[1:5] == (_native.DTYPE_CODES[torch.bfloat16], 0, -1, 4)
    assert words[5:9] == (2, 4, 3, 8) and words[9:13] == x.stride()
    assert _native._descriptor(torch.empty(5))[4:10] == (1, 5, 0, 0, 0, 1)
    assert _native._descriptor(None)[4] == -1
    with pytest.raises(ValueError, match="at most 4 dims"):
        _native._descriptor(torch.empty(1, 1, 1, 1, 1))


def test_a_plan_keeps_everything_but_the_data_pointers(monkeypatch):
    """attn_sm90's eager calls reuse a plan per signature: its words are the descriptors' with the data
    pointers written in at the slots of the tensors that are present, for every call."""
    import ctypes

    import torch

    seen = []

    class Module:  # stands in for a loaded module: its op records the descriptor words it is passed
        def op(self, name):
            def fn(words, ints, floats, stream, ret):
                seen.append([ctypes.cast(words, ctypes.POINTER(ctypes.c_int64))[i] for i in range(6 * step)])
                return 0

            return fn

    step = _native.DESC_WORDS
    monkeypatch.setattr(_native, "_raw_stream", lambda device: 0)
    q, k, out, ws = (torch.empty(1, 2, 8, 64, dtype=torch.float16) for _ in range(4))
    plan = _native.Plan(Module(), "attn_sm90", (q, k, k, out, None, ws), (0, 64, 1, 0), (0.1, 0.2))
    assert plan.slots == (0, step, 2 * step, 3 * step, 5 * step)
    assert list(plan.words[4 * step : 5 * step]) == list(_native._descriptor(None))
    assert list(plan.words[1:5]) == [_native.DTYPE_CODES[torch.float16], 0, -1, 4]
    for _ in range(2):
        fresh = [torch.empty_like(q) for _ in range(5)]
        plan.run(fresh, -1)
        assert [seen[-1][slot] for slot in plan.slots] == [t.data_ptr() for t in fresh]
        assert seen[-1][1:step] == list(plan.words[1:step])
