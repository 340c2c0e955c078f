"""Wheel naming: build tags and local versions encode and decode both ways; bad names are rejected."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sagebuild import tags
from sagebuild.errors import TagError
from sagebuild.matrix import load

PLATFORMS = {"linux": "linux_x86_64", "windows": "win_amd64"}
NAMING = {"sageattention": "build-tag", "sageattn3": "local-version"}


@pytest.fixture(scope="module")
def matrix():
    return load()


def parse(name, matrix):
    return tags.parse_wheel_name(
        name, matrix.torch, matrix.cuda, matrix.wheel_platforms(), matrix.naming(), matrix.abi3_entries()
    )


def test_documented_examples(matrix):
    assert tags.build_tag("2.8.0", "12.9") == "280.129"
    assert tags.build_tag("2.6.0", "12.6") == "260.126"
    assert tags.build_tag("2.14.1", "13.0") == "2141.130"
    assert tags.local_version("2.9.0", "12.8") == "cu128torch2.9.0"
    name = parse("sageattention-2.2.0-280.129-cp312-cp312-linux_x86_64.whl", matrix)
    assert (name.torch, name.cuda, name.python, name.platform, name.kind) == (
        "2.8.0",
        "12.9",
        "3.12",
        "linux",
        "build-tag",
    )
    win = parse("sageattention-2.2.0-260.126-cp39-cp39-win_amd64.whl", matrix)
    assert (win.torch, win.cuda, win.python, win.platform) == ("2.6.0", "12.6", "3.9", "windows")
    sage3 = parse("sageattn3-1.0.0+cu128torch2.9.0-cp312-cp312-linux_x86_64.whl", matrix)
    assert (sage3.torch, sage3.cuda, sage3.public_version, sage3.kind) == (
        "2.9.0",
        "12.8",
        "1.0.0",
        "local-version",
    )
    repaired = parse("sageattention-2.2.0-2141.130-cp311-cp311-manylinux_2_28_x86_64.whl", matrix)
    assert (repaired.torch, repaired.platform) == ("2.14.1", "linux")
    arm = parse("sageattention-2.2.0-2141.130-cp311-cp311-manylinux_2_28_aarch64.whl", matrix)
    assert (arm.torch, arm.platform, arm.platform_tag) == (
        "2.14.1",
        "linux-aarch64",
        "manylinux_2_28_aarch64",
    )
    pure = parse("sageattention-2.2.0-py3-none-any.whl", matrix)
    assert pure.kind == "pure" and pure.torch is None


def test_every_matrix_release_round_trips(matrix):
    for torch in matrix.torch:
        for cuda in matrix.cuda:
            assert tags.decode_build_tag(tags.build_tag(torch, cuda), matrix.torch, matrix.cuda) == (
                torch,
                cuda,
            )
            local = tags.local_version(torch, cuda)
            assert tags.decode_local_version(local, matrix.torch, matrix.cuda) == (torch, cuda)


versions3 = st.tuples(st.integers(1, 9), st.integers(0, 30), st.integers(0, 12)).map(
    lambda v: "{}.{}.{}".format(*v)
)
versions2 = st.tuples(st.integers(10, 14), st.integers(0, 12)).map(lambda v: "{}.{}".format(*v))


@given(
    torch=versions3,
    cuda=versions2,
    others=st.lists(versions3, max_size=6),
    other_cuda=st.lists(versions2, max_size=4),
)
def test_round_trip_or_reported_ambiguity(torch, cuda, others, other_cuda):
    """Decoding gives the version back unless another known version encodes the same digits, in which
    case it is refused as ambiguous (never silently wrong)."""
    known_torch, known_cuda = {torch, *others}, {cuda, *other_cuda}
    tag = tags.build_tag(torch, cuda)
    clash_torch = {v for v in known_torch if tags.torch_tag(v) == tags.torch_tag(torch)} - {torch}
    clash_cuda = {v for v in known_cuda if tags.cuda_digits(v) == tags.cuda_digits(cuda)} - {cuda}
    if clash_torch or clash_cuda:
        with pytest.raises(TagError, match="ambiguous"):
            tags.decode_build_tag(tag, known_torch, known_cuda)
    else:
        assert tags.decode_build_tag(tag, known_torch, known_cuda) == (torch, cuda)


@given(python=st.integers(9, 20))
def test_python_tag_round_trip(python):
    version = f"3.{python}"
    assert tags.decode_python_tag(tags.python_tag(version)) == version


@pytest.mark.parametrize(
    "filename,reason",
    [
        ("sageattention-2.2.0-cp312-cp312-linux_x86_64.whl", "must carry the {torch}.{cuda} build tag"),
        ("sageattention-2.2.0-280-cp312-cp312-linux_x86_64.whl", "not {torch}.{cuda} digits"),
        ("sageattention-2.2.0-250.129-cp312-cp312-linux_x86_64.whl", "does not name a PyTorch version"),
        ("sageattention-2.2.0-280.118-cp312-cp312-linux_x86_64.whl", "does not name a CUDA version"),
        ("sageattention-2.2.0-28.129-cp312-cp312-linux_x86_64.whl", "too short"),
        ("sageattention-2.2.0+cu129-280.129-cp312-cp312-linux_x86_64.whl", "not a local version"),
        ("sageattention-2.2.0-280.129-py3-none-any.whl", "must not carry a build tag"),
        ("sageattention-2.2.0-280.129-cp312-abi3-linux_x86_64.whl", "is tagged cp310-abi3, not cp312"),
        ("sageattention-2.2.0-280.129-cp310-abi3-linux_x86_64.whl", "carries no {torch}.{cuda} build tag"),
        ("sageattention-2.2.0+cu13-cp310-abi3-linux_x86_64.whl", "is the default line"),
        ("sageattention-2.2.0+cu11-cp310-abi3-linux_x86_64.whl", "CUDA line 11 is not in build-matrix.yaml"),
        ("sageattention-2.2.0+cu128torch2.9.0-cp310-abi3-linux_x86_64.whl", "local version is its CUDA line"),
        ("sageattn3-1.0.0-cp312-abi3-linux_x86_64.whl", "is tagged cp310-abi3, not cp312"),
        ("sageattn3-1.0.0+cu128torch2.9.0-cp310-abi3-linux_x86_64.whl", "local version is its CUDA line"),
        ("sageattention-2.2.0-280.129-cp312.cp313-cp312-linux_x86_64.whl", "exactly one Python"),
        ("sageattention-2.2.0-280.129-cp312-cp312-macosx_14_0_arm64.whl", "is not one of ours"),
        ("sageattention-2.2.0-280.129-cp312-cp312-manylinux_2_28_ppc64le.whl", "is not one of ours"),
        ("sageattention-2.2.0-280.129-pp310-pp310-linux_x86_64.whl", "not a CPython tag"),
        ("sageattn3-1.0.0-cp312-cp312-linux_x86_64.whl", "must carry the local version"),
        ("sageattn3-1.0.0+cu128torch2.9-cp312-cp312-linux_x86_64.whl", "is not cu{cuda}torch{version}"),
        ("sageattn3-1.0.0+cu128-280.128-cp312-cp312-linux_x86_64.whl", "not a build tag"),
        ("flash_attn-2.8.0-280.129-cp312-cp312-linux_x86_64.whl", "is not built here"),
        ("sageattention-2.2.0.whl", "not a valid wheel file name"),
        ("sageattention-2.2.0-x80.129-cp312-cp312-linux_x86_64.whl", "not a valid wheel file name"),
    ],
)
def test_malformed_names_rejected_with_reason(matrix, filename, reason):
    with pytest.raises(TagError) as info:
        parse(filename, matrix)
    assert reason in str(info.value)


def test_an_abi3_name_of_a_package_without_abi3_wheels_is_rejected(matrix):
    entries = {k: v for k, v in matrix.abi3_entries().items() if k != "sageattn3"}
    with pytest.raises(TagError, match="sageattn3 has no abi3 wheels"):
        tags.parse_wheel_name("sageattn3-1.0.0-cp310-abi3-linux_x86_64.whl", matrix.torch, matrix.cuda,
                              matrix.wheel_platforms(), matrix.naming(), entries)  # fmt: skip


def test_sageattn3_abi3_names_decode_to_their_cuda_line(matrix):
    for filename, line in (("sageattn3-1.0.0-cp310-abi3-linux_x86_64.whl", "13"),
                           ("sageattn3-1.0.0+cu12-cp310-abi3-win_amd64.whl", "12")):  # fmt: skip
        name = parse(filename, matrix)
        got = (name.kind, name.project, name.cuda, name.torch, name.python)
        assert got == ("abi3", "sageattn3", line, None, "3.10")


def test_ambiguous_tag_rejected():
    with pytest.raises(TagError, match="ambiguous: it reads as 2.1.41 or 2.14.1"):
        tags.decode_torch_tag("2141", ["2.1.41", "2.14.1"])
    assert tags.decode_torch_tag("2141", ["2.14.1", "2.8.0"]) == "2.14.1"
    assert tags.decode_torch_tag("2100", ["2.10.0", "2.1.0"]) == "2.10.0"  # no part with a leading zero


def test_a_manylinux_tag_belongs_to_the_platform_of_its_cpu():
    """The repaired tag of a Linux platform is found from its wheel tag's CPU: no platform is named in
    the code (``linux_aarch64`` -> manylinux_*_aarch64, whatever the platform is called)."""
    platforms = {"linux": "linux_x86_64", "windows": "win_amd64", "arm": "linux_aarch64"}
    for tag, platform in [
        ("manylinux_2_28_x86_64", "linux"),
        ("manylinux2014_x86_64", "linux"),
        ("manylinux_2_28_aarch64", "arm"),
        ("manylinux_2_17_aarch64", "arm"),
        ("linux_aarch64", "arm"),
        ("win_amd64", "windows"),
        ("manylinux_2_28_ppc64le", None),
        ("win_arm64", None),
    ]:
        assert tags.platform_of_tag(tag, platforms) == platform, tag
    assert tags.platform_of_tag("manylinux_2_28_aarch64", PLATFORMS) is None
