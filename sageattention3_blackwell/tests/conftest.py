"""Puts the sageattn3 source tree (and this folder, for sage3_toolchain) on sys.path, so the tests run
from the repository root (``python -m pytest sageattention3_blackwell/tests/unit``) without installing
the package, and copies into that tree the files a build takes from the repository (shared_sources.py:
the package-neutral C ABI, and the setup.py pieces of sage_setup.py), as the build does."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE_ROOT = TESTS.parent
for path in (PACKAGE_ROOT, TESTS):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from shared_sources import sync  # noqa: E402

sync(PACKAGE_ROOT)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (run on the device machine)")
