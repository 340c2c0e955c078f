"""The README test command must reach every CPU test tree, the real wheel build included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_test_command_collects_the_build_and_sageattn3_tests():
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "not gpu", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "tests/build/test_wheel_build.py::test_real_wheel_build_and_verify" in out
    assert "sageattention3_blackwell/tests/unit/" in out
