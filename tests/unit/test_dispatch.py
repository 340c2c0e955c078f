"""The dispatch table: decisions for pretend GPUs and pretend builds, reasons, explain(), memoization."""

from __future__ import annotations

import pytest
import torch

from sageattention import dispatch, ops
from sageattention.dispatch import Request

BF16 = torch.bfloat16


@pytest.fixture
def built(monkeypatch):
    """Pretend builds: built(cuda={"sm90"}, triton=True) makes those available."""

    def configure(cuda=(), triton=True):
        cuda = set(cuda)
        monkeypatch.setattr(
            ops, "cuda_unavailable_reason", lambda arch: None if arch in cuda else f"{arch} not built"
        )
        monkeypatch.setattr(ops, "triton_unavailable_reason", lambda: None if triton else "no triton")

    configure()
    return configure


def req(capability=(9, 0), device_type="cuda", head_dim=128, **kw):
    return Request(device_type, capability, BF16, head_dim, **kw)


def chosen(request):
    entry, _ = dispatch.decide(request)
    return entry.backend.name


ALL_CUDA = {"sm80", "sm89", "sm90"}


@pytest.mark.parametrize(
    "capability,cuda,triton,expected",
    [
        ((9, 0), ALL_CUDA, True, "triton_fp8"),  # measured faster than the CUDA sm90 kernel today
        ((9, 0), ALL_CUDA, False, "cuda_sm90"),  # no Triton: the compiled kernel
        ((9, 0), {"sm80", "sm89"}, True, "triton_fp8"),
        ((9, 0), set(), False, "sdpa"),
        ((8, 9), ALL_CUDA, True, "cuda_sm89"),
        ((8, 9), set(), True, "triton_fp8"),
        ((10, 0), {"sm89"}, True, "cuda_sm89"),
        ((10, 0), set(), True, "triton_fp8"),
        ((12, 0), {"sm89"}, True, "cuda_sm89"),
        ((12, 0), set(), True, "triton_fp8"),  # sm120+: Triton's FP8 path is allowed
        ((12, 1), set(), True, "triton_fp8"),
        ((8, 0), ALL_CUDA, True, "cuda_sm80"),
        ((8, 6), {"sm80"}, True, "cuda_sm80"),
        ((8, 7), set(), True, "triton_fp16"),
        ((8, 6), {"sm89", "sm90"}, True, "triton_fp16"),  # FP8 kernels are not routed to Ampere
        ((10, 3), set(), True, "triton_fp16"),  # an arch the table does not name: the portable path
        ((8, 9), set(), False, "sdpa"),
        ((7, 5), ALL_CUDA, True, "sdpa"),
        ((6, 1), ALL_CUDA, True, "sdpa"),
    ],
)
def test_table_decisions(built, capability, cuda, triton, expected):
    built(cuda=cuda, triton=triton)
    assert chosen(req(capability)) == expected


@pytest.mark.parametrize("capability", [(9, 0), (8, 9), (8, 0)])
def test_masks_skip_the_cuda_kernels(built, capability):
    built(cuda=ALL_CUDA)
    name = chosen(req(capability, has_mask=True))
    assert name.startswith("triton_"), name


def test_varlen_skips_the_cuda_kernels(built):
    built(cuda=ALL_CUDA)
    assert chosen(req((9, 0), varlen=True)) == "triton_fp8"
    assert chosen(req((8, 0), varlen=True)) == "triton_fp16"


@pytest.mark.parametrize(
    "request_,reason",
    [
        (req(None, "cpu"), "device cpu is not a CUDA GPU"),
        (req(None, "mps"), "device mps is not a CUDA GPU"),
        (req((7, 5)), "needs sm80 or newer, this GPU is sm75"),
        (req((9, 0), is_hip=True), "ROCm GPUs are not supported"),
        (req((9, 0), head_dim=129), "head_dim > 128 (triton_fp8, cuda_sm90, triton_fp16)"),
    ],
)
def test_fallback_reasons(built, request_, reason):
    entry, reasons = dispatch.decide(request_)
    assert entry.backend is dispatch.SDPA
    assert any(reason in r for r in reasons), reasons


def test_fallback_reason_names_each_missing_backend(built):
    built(cuda=(), triton=False)
    _, reasons = dispatch.decide(req((9, 0)))
    assert reasons == ["no triton (triton_fp8, triton_fp16)", "sm90 not built (cuda_sm90)"]


def test_real_availability_reasons_are_recorded():
    """Without pretend builds: the compiled extensions are absent in a source tree, with the ImportError."""
    module, reason = ops.extension_status("sm90")
    assert module is None and "ModuleNotFoundError" in reason
    assert "could not be imported" in ops.cuda_unavailable_reason("sm90")


def test_table_is_ordered_data_ending_with_sdpa():
    assert all(isinstance(e, dispatch.Entry) for e in dispatch.TABLE)
    assert dispatch.TABLE[-1].backend is dispatch.SDPA
    assert dispatch.TABLE[-1].route(req(None, "cpu"))
    names = [e.backend.name for e in dispatch.TABLE]
    assert names.index("cuda_sm89") < names.index("triton_fp16") < names.index("sdpa")
    assert names.index("triton_fp8") < names.index("cuda_sm90")  # measured: see dispatch.TABLE
    assert set(dispatch.BACKENDS) == set(names)


def test_select_memoizes(built, monkeypatch):
    monkeypatch.setattr(dispatch, "device_capability", lambda t, i: (9, 0))
    calls = []
    real = dispatch.decide
    monkeypatch.setattr(dispatch, "decide", lambda r: calls.append(r) or real(r))
    for _ in range(3):
        assert dispatch.select("cuda", 0, BF16, 128, False, False, False) == "triton_fp8"
    assert len(calls) == 1


def test_capability_is_queried_once_per_device(monkeypatch):
    queries = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: queries.append(i) or (8, 6))
    for _ in range(3):
        assert dispatch.device_capability("cuda", 1) == (8, 6)
    assert dispatch.device_capability("cuda", 0) == (8, 6)
    assert dispatch.device_capability("cpu", None) is None
    assert queries == [1, 0]


def test_forced_cuda_variant_not_built(built, monkeypatch):
    monkeypatch.setattr(dispatch, "device_capability", lambda t, i: (9, 0))
    with pytest.raises(
        RuntimeError,
        match=r"^sageattn_qk_int8_pv_fp8_cuda_sm90\(\) is not built in this installation "
        r"\(reason: sm90 not built\); use sageattn\(\) which picks an available backend",
    ):
        dispatch.select(
            "cuda", 0, BF16, 128, False, False, False, "cuda_sm90", "sageattn_qk_int8_pv_fp8_cuda_sm90"
        )


def test_forced_variant_needs_its_arch(built, monkeypatch):
    monkeypatch.setattr(dispatch, "device_capability", lambda t, i: (8, 6))
    with pytest.raises(
        RuntimeError, match=r"cannot run here \(triton_fp8: needs sm89 or newer, this GPU is sm86\)"
    ):
        dispatch.select(
            "cuda", 0, BF16, 128, False, False, False, "triton_fp8", "sageattn_qk_int8_pv_fp8_triton"
        )
    assert dispatch.select("cuda", 0, BF16, 128, False, False, False, "triton_fp16", "x") == "triton_fp16"


def test_forced_sm80_kernels_run_on_newer_gpus(built, monkeypatch):
    """The named fp16 CUDA variant is not limited to the archs the table routes to it."""
    built(cuda={"sm80"})
    monkeypatch.setattr(dispatch, "device_capability", lambda t, i: (9, 0))
    assert dispatch.select("cuda", 0, BF16, 128, False, False, False, "cuda_sm80", "f") == "cuda_sm80"


def test_explain_cpu():
    info = dispatch.explain("cpu")
    assert info["backend"] == "sdpa" and info["capability"] is None
    assert info["reasons"] == ["device cpu is not a CUDA GPU"]
    assert [row["status"] for row in info["table"]][-1] == "chosen"
    assert all(row["status"] == "not routed here" for row in info["table"][:-1])


def test_explain_pretend_sm90(built, monkeypatch):
    built(cuda=(), triton=True)
    monkeypatch.setattr(dispatch, "device_capability", lambda t, i: (9, 0))
    info = dispatch.explain(torch.device("cuda", 0))
    assert info["backend"] == "triton_fp8" and info["capability"] == "sm90"
    status = {row["row"]: row["status"] for row in info["table"]}
    assert status["sm90: CUDA sm90 kernel"] == "not reached"
    assert status["sm90: Triton FP8"] == "chosen"
    assert status["sm80 and newer: Triton FP16"] == "not reached"
    assert status["sm80/sm86/sm87: CUDA sm80 kernel"] == "not routed here"


def test_explain_does_not_warn(recwarn):
    dispatch.explain("cpu")
    assert len(recwarn) == 0
