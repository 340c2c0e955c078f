"""The dispatch table: decisions for pretend GPUs and pretend builds, reasons, explain(), memoization."""

from __future__ import annotations

import importlib

import pytest
import torch

from sageattention import _native, cuda_sm89, dispatch, extensions, ops
from sageattention._checks import ANY_MASK, KEY_PADDING_MASK, NO_MASK, mask_kind
from sageattention.dispatch import Request
from sageattention.quant import PVAccum, PVDtype

BF16 = torch.bfloat16


@pytest.fixture
def built(monkeypatch):
    """Pretend builds: built(cuda={"sm90"}, triton=True) makes those available; ``archs`` is the build's
    record of the archs each compiled module holds code for (_build_info.json's "extensions"; none by
    default, as in a source tree)."""

    def configure(cuda=(), triton=True, archs=None):
        cuda = set(cuda)
        monkeypatch.setattr(
            extensions, "cuda_unavailable_reason", lambda arch: None if arch in cuda else f"{arch} not built"
        )
        monkeypatch.setattr(ops, "triton_unavailable_reason", lambda: None if triton else "no triton")
        record = {"extensions": {f"sageattention.{m}": a for m, a in (archs or {}).items()}} if archs else {}
        monkeypatch.setattr(_native, "_build_record", [record])

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
        ((9, 0), ALL_CUDA, True, "cuda_sm90"),  # measured faster than Triton FP8 at every length
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


@pytest.mark.parametrize(
    "capability,expected", [((9, 0), "cuda_sm90"), ((8, 9), "triton_fp8"), ((8, 0), "triton_fp16")]
)
def test_key_padding_masks_take_the_sm90_kernel(built, capability, expected):
    """The sm90 kernel takes key-padding masks (kv_len); other masks and the other families go to Triton."""
    built(cuda=ALL_CUDA)
    assert chosen(req(capability, has_mask=KEY_PADDING_MASK)) == expected
    assert chosen(req(capability, has_mask=ANY_MASK)).startswith("triton_")
    assert req(has_mask=True).has_mask == ANY_MASK and req(has_mask=False).has_mask == NO_MASK
    _, reasons = dispatch.decide(req((9, 0), has_mask=ANY_MASK))
    assert any("other than a key-padding mask" in r for r in reasons), reasons


def test_mask_kinds():
    keep = torch.ones(2, 1, 1, 8, dtype=torch.bool)
    assert mask_kind(None, False) == NO_MASK
    for m in (keep, keep.expand(2, 4, 5, 8), keep[0, 0], keep[0], keep[0, 0, 0]):
        assert mask_kind(m, False) == KEY_PADDING_MASK, m.shape
    assert mask_kind(keep, True) == ANY_MASK  # with is_causal
    assert mask_kind(keep.float(), False) == ANY_MASK  # additive
    assert mask_kind(torch.ones(5, 8, dtype=torch.bool), False) == ANY_MASK  # a row per query
    assert mask_kind(torch.ones(2, 4, 1, 8, dtype=torch.bool), False) == ANY_MASK  # a row per head


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
        (req((9, 0), head_dim=129), "head_dim > 128 (cuda_sm90, triton_fp8, triton_fp16)"),
    ],
)
def test_fallback_reasons(built, request_, reason):
    entry, reasons = dispatch.decide(request_)
    assert entry.backend is dispatch.SDPA
    assert any(reason in r for r in reasons), reasons


def test_fallback_reason_names_each_missing_backend(built):
    built(cuda=(), triton=False)
    _, reasons = dispatch.decide(req((9, 0)))
    assert reasons == ["sm90 not built (cuda_sm90)", "no triton (triton_fp8, triton_fp16)"]


@pytest.mark.parametrize(
    "arch,capability,runs",
    [
        ("8.0", (8, 0), True),
        ("8.0", (8, 6), True),  # SASS runs on a later minor of its major
        ("8.6", (8, 0), False),
        ("8.9", (9, 0), False),  # not on another major
        ("9.0a", (9, 0), True),
        ("12.0a", (12, 1), False),  # an arch-specific build runs on its own arch only
        ("10.0f", (10, 3), True),  # a family build: the family's later minors
        ("10.0f", (12, 0), False),
        ("sm_90", (8, 0), True),  # a form the record should not hold: the driver decides
    ],
)
def test_sass_runs_on(arch, capability, runs):
    assert extensions.sass_runs_on(arch, capability) is runs


#: The default build's record (build-matrix.yaml, archs 8.0 8.6 8.9 9.0a 12.0a; 10.0a is optional).
DEFAULT_ARCHS = {
    "_fused": ["8.0", "8.6", "8.9", "9.0a", "12.0a"],
    "_qattn_sm80": ["8.0", "8.6", "8.9", "9.0a", "12.0a"],
    "_qattn_sm89": ["8.9", "9.0a", "12.0a"],
    "_qattn_sm90": ["9.0a"],
}


@pytest.mark.parametrize(
    "capability,expected",
    [((9, 0), "cuda_sm90"), ((8, 9), "cuda_sm89"), ((12, 0), "cuda_sm89"), ((10, 0), "triton_fp8"),
     ((12, 1), "triton_fp8"), ((8, 6), "cuda_sm80"), ((8, 7), "cuda_sm80")],
)  # fmt: skip
def test_a_build_without_code_for_the_gpu_is_passed_over(built, capability, expected):
    """A compiled module that imports but holds no SASS for the GPU (a default wheel on a B200, say)
    is not picked: its launch would fail with "no kernel image"."""
    built(cuda=ALL_CUDA, archs=DEFAULT_ARCHS)
    assert chosen(req(capability)) == expected


def test_the_reason_names_the_gpu_and_the_build_archs(built):
    built(cuda=ALL_CUDA, triton=False, archs=DEFAULT_ARCHS)
    entry, reasons = dispatch.decide(req((10, 0)))
    assert entry.backend is dispatch.SDPA
    assert reasons[0] == (
        "sageattention._qattn_sm89 holds no code for this GPU (10.0; built for 8.9, 9.0a, 12.0a); "
        "a build with 10.0a in TORCH_CUDA_ARCH_LIST has it (cuda_sm89)"
    )


def test_the_fused_quantization_needs_code_for_the_gpu_too(built):
    """The kernels read what the fused quantization ops write: both need code for the GPU."""
    built(cuda=ALL_CUDA, archs={**DEFAULT_ARCHS, "_qattn_sm89": ["8.9", "10.0a"]})
    _, reasons = dispatch.decide(req((10, 0)))
    assert reasons[0].startswith("sageattention._fused holds no code for this GPU (10.0;"), reasons
    built(cuda=ALL_CUDA, archs={**DEFAULT_ARCHS, "_qattn_sm89": ["8.9", "10.0a"], "_fused": ["8.9", "10.0a"]})
    assert chosen(req((10, 0))) == "cuda_sm89"


def test_forced_variant_without_code_for_the_gpu(built, monkeypatch):
    built(cuda=ALL_CUDA, archs=DEFAULT_ARCHS)
    monkeypatch.setattr(dispatch, "device_capability", lambda t, i: (10, 0))
    with pytest.raises(
        RuntimeError, match=r"cannot run here \(cuda_sm89: sageattention._qattn_sm89 holds no code"
    ):
        dispatch.select(
            "cuda", 0, BF16, 128, False, False, False, "cuda_sm89", "sageattn_qk_int8_pv_fp8_cuda"
        )


def test_build_record_is_read_from_the_package(monkeypatch):
    """extensions.build_info reads _build_info.json beside the package's modules; none there (a source tree):
    no record, and nothing is passed over for want of one."""
    monkeypatch.setattr(_native, "_build_record", [])
    assert extensions.build_info() == {}
    assert extensions.cuda_image_missing_reason("sm89", (10, 0)) is None


def test_real_availability_reasons_are_recorded():
    """Without pretend builds: the compiled extensions are absent in a source tree, and say so."""
    module, reason = extensions.extension_status("sm90")
    assert module is None and "is not built in this installation" in reason
    assert "could not be imported" in extensions.cuda_unavailable_reason("sm90")


def test_table_is_ordered_data_ending_with_sdpa():
    assert all(isinstance(e, dispatch.Entry) for e in dispatch.TABLE)
    assert dispatch.TABLE[-1].backend is dispatch.SDPA
    assert dispatch.TABLE[-1].route(req(None, "cpu"))
    names = [e.backend.name for e in dispatch.TABLE]
    assert names.index("cuda_sm89") < names.index("triton_fp16") < names.index("sdpa")
    assert set(dispatch.BACKENDS) == set(names)


def test_sm90_takes_the_cuda_kernel(built):
    """Measured (dispatch.TABLE's note): the CUDA kernel leads Triton at every length; Triton stands in
    when the kernel is missing, and masks other than key-padding masks stay with Triton."""
    built(cuda=ALL_CUDA)
    assert chosen(req()) == "cuda_sm90"
    assert chosen(req(has_mask=True)) == "triton_fp8"
    built(cuda=ALL_CUDA - {"sm90"})
    assert chosen(req()) == "triton_fp8"
    built(cuda=ALL_CUDA, triton=False)
    assert chosen(req()) == "cuda_sm90"


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
    assert status["sm90: CUDA sm90 kernel"] == "skipped: sm90 not built"
    assert status["sm90: Triton FP8"] == "chosen"
    assert status["sm80 and newer: Triton FP16"] == "not reached"
    assert status["sm80/sm86/sm87: CUDA sm80 kernel"] == "not routed here"


def test_explain_does_not_warn(recwarn):
    dispatch.explain("cpu")
    assert len(recwarn) == 0


# --------------------------------------------------------------------------------------------------
# The compiled backends: which arch family each serves, and the accumulation option they map


def test_compiled_families_are_wired():
    assert set(extensions.WIRED_EXTENSIONS) == {"sm80", "sm89", "sm90"}


@pytest.mark.parametrize(
    "backend,arch", [("cuda_sm80", "sm80"), ("cuda_sm89", "sm89"), ("cuda_sm90", "sm90")]
)
def test_cuda_backends_pass_their_arch(monkeypatch, backend, arch):
    seen = []
    monkeypatch.setattr(ops, "cuda_attention", lambda q, k, v, **kw: seen.append(kw) or ("out", None))
    assert dispatch.BACKENDS[backend].dense(1, 2, 3, is_causal=True, options={}) == ("out", None)
    assert seen == [{"arch": arch, "is_causal": True, "options": {}}]


def _cpu_qkv(d):
    q = torch.randn(1, 4, 8, d, dtype=torch.float16)
    k = torch.randn(1, 2, 8, d, dtype=torch.float16)
    return q, k, torch.randn_like(k)


_MAPPED = [
    (None, {"sm80": "fp32", "sm89": "fp32+fp16"}),
    (PVAccum.FP16_FP32, {"sm80": "fp16+fp32", "sm89": "fp32+fp16"}),
    (PVAccum.FP32_FP32, {"sm80": "fp32", "sm89": "fp32+fp32"}),
    (PVAccum.FP32, {"sm80": "fp32", "sm89": "fp32"}),
]


@pytest.mark.parametrize("arch,launcher", [("sm80", "attention_sm80"), ("sm89", "attention_sm89")])
@pytest.mark.parametrize("accum,expected", _MAPPED)
def test_cuda_attention_runs_the_arch_launcher(monkeypatch, arch, launcher, accum, expected):
    """ops.cuda_attention calls the family's launcher with the accumulation the option maps to."""
    module = importlib.import_module(f"sageattention.cuda_{arch}")
    calls = []
    monkeypatch.setattr(module, launcher, lambda q, k, v, **kw: calls.append(kw) or (q, None))
    monkeypatch.setattr(cuda_sm89, "fp16_accum_available", lambda: True)
    q, k, v = _cpu_qkv(64)
    ops.cuda_attention(q, k, v, arch=arch, attn_mask=None, is_causal=True, sm_scale=0.125, return_lse=False,
                       smooth_k=True, pv=None, options={"pv_accum": accum})  # fmt: skip
    # check=False: the entry points have checked q, k and v already.
    assert calls == [{"is_causal": True, "sm_scale": 0.125, "smooth_k": True, "return_lse": False,
                      "check": False, "pv_accum": expected[arch]}]  # fmt: skip


def test_sm89_without_fp16_accumulation_falls_back_once(monkeypatch, recwarn):
    monkeypatch.setattr(cuda_sm89, "fp16_accum_available", lambda: False)
    monkeypatch.setattr(ops, "_fp16_accum_warned", [])
    assert ops._pv_accum("sm89", {"pv_accum": None}) == "fp32+fp32"
    assert len(recwarn) == 0  # the backend's own default: no warning
    for _ in range(2):
        assert ops._pv_accum("sm89", {"pv_accum": PVAccum.FP32_FP16}) == "fp32+fp32"
    assert len(recwarn) == 1 and "CUDA older than 12.8" in str(recwarn[0].message)


@pytest.mark.parametrize("arch,pv", [("sm80", PVDtype.FP16), ("sm89", PVDtype.FP8), ("sm90", PVDtype.FP8)])
def test_head_dims_the_kernels_cannot_store_go_to_triton(monkeypatch, arch, pv):
    calls = []
    monkeypatch.setattr(ops, "triton_attention", lambda q, k, v, **kw: calls.append(kw) or (q, None))
    q, k, v = _cpu_qkv(36)
    ops.cuda_attention(q, k, v, arch=arch, attn_mask=None, is_causal=False, sm_scale=0.1, return_lse=True,
                       smooth_k=False, pv=pv, options={})  # fmt: skip
    assert len(calls) == 1 and calls[0]["pv"] is pv and calls[0]["return_lse"]


def test_cuda_attention_names_valid_archs():
    q, k, v = _cpu_qkv(64)
    args = {"attn_mask": None, "is_causal": False, "sm_scale": 0.1, "return_lse": False, "smooth_k": False}
    with pytest.raises(
        ValueError, match="arch='sm70' has no compiled kernels; valid values: sm80, sm89, sm90"
    ):
        ops.cuda_attention(q, k, v, arch="sm70", pv=None, options={}, **args)


def test_cuda_quantization_of_the_triton_path_needs_code_for_the_gpu(monkeypatch):
    monkeypatch.setattr(ops, "fused_quant_unavailable_reason", lambda: None)
    monkeypatch.setattr(_native, "_build_record", [{"extensions": {"sageattention._fused": ["8.0", "9.0a"]}}])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    q = torch.zeros(1, 1, 4, 8, dtype=BF16)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    with pytest.raises(
        RuntimeError, match=r"quantization_backend='cuda' needs .*_fused holds no code .*\(10\.0;"
    ):
        ops.triton_attention(
            q, q, q, attn_mask=None, is_causal=False, sm_scale=1.0, return_lse=False, smooth_k=True,
            pv=PVDtype.FP8, options={"quantization_backend": "cuda"},
        )  # fmt: skip


def test_the_record_setup_py_writes_is_the_one_read(monkeypatch):
    """setup.py records {plan.name: plan.archs} of the matrix's extension plan (build_info); read back,
    a default build serves each family's own GPUs and not sm100."""
    from sagebuild import matrix as build_matrix

    m = build_matrix.load()
    archs, _, _ = m.resolve_archs("sageattention", "13.0", None)
    record = {"extensions": {p.name: list(p.archs) for p in m.extension_plan("sageattention", archs)}}
    monkeypatch.setattr(_native, "_build_record", [record])
    for arch, capability in (("sm90", (9, 0)), ("sm89", (8, 9)), ("sm89", (12, 0)), ("sm80", (8, 6))):
        assert extensions.cuda_image_missing_reason(arch, capability) is None, (arch, capability)
    assert "holds no code for this GPU (10.0;" in extensions.cuda_image_missing_reason("sm89", (10, 0))


@pytest.mark.parametrize("arch", ["sm80", "sm89", "sm90"])
def test_cuda_attention_traces_in_one_graph(monkeypatch, arch):
    """torch.compile(fullgraph=True) traces the way from ops.cuda_attention to each family's launcher
    (the launchers themselves stand in here: no GPU): a lookup dynamo cannot trace (importlib, ctypes)
    on that way breaks the graph on the GPU machine."""
    module = importlib.import_module(f"sageattention.cuda_{arch}")
    monkeypatch.setattr(module, f"attention_{arch}", lambda q, k, v, **kw: (q * 2, None))
    monkeypatch.setattr(cuda_sm89, "fp16_accum_available", lambda: True)
    torch._dynamo.reset()

    def call(q):
        return ops.cuda_attention(q, q, q, arch=arch, attn_mask=None, is_causal=False, sm_scale=0.125,
                                  return_lse=False, smooth_k=True, pv=None,
                                  options={"pv_accum": None})[0]  # fmt: skip

    q = torch.randn(1, 2, 8, 64)
    assert torch.equal(torch.compile(call, fullgraph=True, backend="eager")(q), q * 2)
