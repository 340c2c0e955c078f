"""The client libraries of the integrations, imported only when an integration is used."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(package: str, integration: str, checked_with: str) -> ModuleType:
    """Import ``package`` for ``integration``, or raise an ImportError that names the missing package."""
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        raise ImportError(
            f"{integration} needs the {package} package, which cannot be imported here ({exc}); "
            f"install {package} (checked with {package} {checked_with}): pip install {package}",
            name=package,
        ) from exc
