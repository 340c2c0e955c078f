"""Puts the sageattn3 source tree on sys.path, so the tests run from the repository root
(``python -m pytest sageattention3_blackwell/tests/unit``) without installing the package."""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
if str(PACKAGE_ROOT) not in sys.path:
    sys.path.insert(0, str(PACKAGE_ROOT))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (run on the device machine)")
