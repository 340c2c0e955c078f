"""bench/results/README.md, the index of the result files, is current (python bench/results_index.py),
and bench/ stays smaller than tests/: superseded runs leave bench/results (git keeps them)."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("results_index", ROOT / "bench" / "results_index.py")
results_index = importlib.util.module_from_spec(spec)
spec.loader.exec_module(results_index)


def test_index_is_current():
    assert results_index.INDEX.read_text(encoding="utf-8") == results_index.current(), (
        "bench/results/README.md is stale: run python bench/results_index.py"
    )


def test_index_names_kind_device_and_date():
    names = ["attention-NVIDIA_H200-2026-11-29z.json", "attention-NVIDIA_H200-2026-11-29ab.json", "x.patch"]
    text = results_index.render([Path(n) for n in names])
    assert (
        "## attention" in text
        and "| 2026-11-29ab | NVIDIA H200 | [attention-NVIDIA_H200-2026-11-29ab.json]" in text
    )
    assert text.index("29ab.json]") < text.index("29z.json]")  # run ab came after run z
    assert "## other" in text and "[x.patch](x.patch)" in text
    assert results_index._kind("backward-accuracy") == "backward-accuracy"  # the longest prefix wins
    assert results_index._kind("backward") == "backward"


def _tracked_bytes(folder: str) -> int:
    """Bytes of the files under ``folder`` that git tracks; outside a git checkout, of every file there
    (caches left out)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--", folder], cwd=ROOT, capture_output=True, check=True
        ).stdout
        paths = [ROOT / name for name in out.decode().split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        paths = [
            path
            for path in (ROOT / folder).rglob("*")
            if not any(part.startswith(".") or part == "__pycache__" for part in path.relative_to(ROOT).parts)
        ]
    return sum(path.stat().st_size for path in paths if path.is_file())


def test_bench_is_smaller_than_tests():
    bench, tests = _tracked_bytes("bench"), _tracked_bytes("tests")
    assert tests > 0
    assert bench <= tests, (
        f"bench/ holds {bench} bytes, tests/ {tests}: remove superseded runs from bench/results (git keeps "
        "them; bench/NOTES.md names the commit) and run python bench/results_index.py"
    )
