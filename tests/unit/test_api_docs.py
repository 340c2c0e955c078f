"""The public API: signatures compatible with the established one, numpy docstrings that document every
parameter (and nothing else) with the signature's defaults, and docs/api.md covering every function."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import sageattention as sa
from sageattention import core

DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"
#: The attention entry points (the established API); the package's other public function is
#: merge_attention (the LSE merge of ring attention, sageattention/merge.py).
PUBLIC = list(core.PUBLIC_FUNCTIONS)
OTHER_PUBLIC = {"merge_attention"}

# Parameters in order, with defaults, as the established API has them (plus the FP8 Triton variant).
_CUDA_HEAD = "q, k, v, tensor_layout='HND', is_causal=False, qk_quant_gran='per_thread', sm_scale=None, "
ESTABLISHED = {
    "sageattn": "q, k, v, tensor_layout='HND', is_causal=False, sm_scale=None, return_lse=False, **kwargs",
    "sageattn_varlen": "q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, "
    "sm_scale=None, smooth_k=True, **kwargs",
    "sageattn_qk_int8_pv_fp16_triton": "q, k, v, tensor_layout='HND', quantization_backend='triton', "
    "is_causal=False, attn_mask=None, sm_scale=None, smooth_k=True, return_lse=False, **kwargs",
    "sageattn_qk_int8_pv_fp8_triton": "q, k, v, tensor_layout='HND', is_causal=False, attn_mask=None, "
    "sm_scale=None, smooth_k=True, return_lse=False, **kwargs",
    "sageattn_qk_int8_pv_fp16_cuda": _CUDA_HEAD
    + "pv_accum_dtype='fp32', smooth_k=True, smooth_v=False, return_lse=False, **kwargs",
    "sageattn_qk_int8_pv_fp8_cuda": _CUDA_HEAD
    + "pv_accum_dtype='fp32+fp16', smooth_k=True, smooth_v=False, return_lse=False, **kwargs",
    "sageattn_qk_int8_pv_fp8_cuda_sm90": _CUDA_HEAD
    + "pv_accum_dtype='fp32+fp32', smooth_k=True, return_lse=False, **kwargs",
}
E = inspect.Parameter.empty


def _signature(fn):
    out = []
    for p in inspect.signature(fn).parameters.values():
        out.append((f"**{p.name}" if p.kind is p.VAR_KEYWORD else p.name, p.default))
    return out


def _section(doc: str, title: str) -> list[str]:
    """Lines of a numpy-style section, up to the next section header."""
    lines = doc.splitlines()
    start = lines.index(title) + 2  # title, then its dashes
    assert set(lines[start - 1]) == {"-"}, f"no underline under {title}"
    end = next(
        (i for i in range(start, len(lines) - 1) if lines[i + 1] and set(lines[i + 1]) == {"-"}), len(lines)
    )
    return lines[start:end]


def _documented(doc: str):
    """(name, default text or None) of every entry of the Parameters section."""
    out = []
    for line in _section(doc, "Parameters"):
        if not line or line[0] == " ":
            continue
        m = re.match(r"^(\*\*\w+)$|^(\w+) : ([^,]+)(?:, default (.+))?$", line)
        assert m, f"not a numpy parameter line: {line!r}"
        out.append((m.group(1) or m.group(2), m.group(4)))
    return out


def test_public_functions_are_the_established_ones():
    assert {fn.__name__ for fn in PUBLIC} == set(ESTABLISHED)
    exported = {name for name in sa.__all__ if inspect.isfunction(getattr(sa, name))}
    assert exported == set(ESTABLISHED) | OTHER_PUBLIC


@pytest.mark.parametrize("fn", PUBLIC, ids=lambda f: f.__name__)
def test_signature_matches_the_established_api(fn):
    rendered = ", ".join(name if default is E else f"{name}={default!r}" for name, default in _signature(fn))
    assert rendered == ESTABLISHED[fn.__name__]


@pytest.mark.parametrize("fn", PUBLIC, ids=lambda f: f.__name__)
def test_docstring_documents_every_parameter(fn):
    doc = inspect.getdoc(fn)
    documented = _documented(doc)
    assert [name for name, _ in documented] == [name for name, _ in _signature(fn)]
    for (name, default_text), (_, default) in zip(documented, _signature(fn)):
        expected = None if default is E else repr(default)
        assert default_text == expected, name
    for line in _section(doc, "Parameters"):
        if line.startswith("    "):
            assert line.strip(), "empty description line"
    assert _section(doc, "Returns") and _section(doc, "Notes")


@pytest.mark.parametrize("fn", PUBLIC, ids=lambda f: f.__name__)
def test_every_parameter_has_a_description(fn):
    lines = _section(inspect.getdoc(fn), "Parameters")
    for i, line in enumerate(lines):
        if line and line[0] != " ":
            assert i + 1 < len(lines) and lines[i + 1].startswith("    "), f"{line!r} has no description"


def test_docstrings_state_the_semantics():
    doc = inspect.getdoc(sa.sageattn)
    assert "query i sees keys j <= i" in doc and "q_len != kv_len" in doc
    assert "output of 0 and an LSE" in doc and "-inf" in doc
    assert "natural log" in doc and "float32" in doc


def test_api_md_covers_every_function_and_parameter():
    text = DOCS.read_text()
    for fn in PUBLIC:
        start = re.search(rf"^{fn.__name__}\(q, k, v", text, re.M).start()  # its signature block
        # the function's section: up to the next level-2 heading (or the end)
        nxt = text.find("\n## ", start)
        section = text[start : nxt if nxt != -1 else len(text)]
        for name, _ in _signature(fn):
            assert f"`{name}`" in section or f"{name}=" in section or f"{name}," in section, (
                fn.__name__,
                name,
            )
