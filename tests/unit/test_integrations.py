"""sageattention.integrations as shipped: listed in the wheel's packages, importable from the installed
wheel (not the checkout) without diffusers or transformers, importing no client and changing no torch
function on import, and failing only when used, with an error that names the missing client."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("sageattention.integrations.sdpa", "sageattention.integrations.transformers",
           "sageattention.integrations.diffusers")  # fmt: skip
#: Left out of the probe's environment: the integrations must not depend on it on import.
ENV_VAR = "SAGEATTENTION_PATCH_SDPA"
CLIENTS = {"sageattention.integrations.transformers": "transformers",
           "sageattention.integrations.diffusers": "diffusers"}  # fmt: skip

# Run in a fresh interpreter: imports every integration, then reports where they came from, which
# clients got imported, whether torch's SDPA changed, and what using each integration without its
# client raises (the clients are hidden through sys.modules where they are installed).
PROBE = r"""
import json, sys
import torch.nn.functional as F
before = F.scaled_dot_product_attention
import sageattention, sageattention.integrations
import sageattention.integrations.sdpa as sdpa
import sageattention.integrations.transformers as st
import sageattention.integrations.diffusers as sd
report = {
    "files": {m.__name__: m.__file__ for m in (sageattention, sdpa, st, sd)},
    "clients_imported": [c for c in ("transformers", "diffusers") if c in sys.modules],
    "sdpa_unchanged": F.scaled_dot_product_attention is before,
    "checked_with": {m.__name__: m.CHECKED_WITH for m in (sdpa, st, sd)},
}
sys.modules["transformers"] = sys.modules["diffusers"] = None
errors = {}
for name, use in (("transformers", st.register), ("diffusers", lambda: sd.sage_processors(object()))):
    try:
        use()
    except ImportError as exc:
        errors[name] = [type(exc).__name__, exc.name, str(exc)]
report["errors"] = errors
print(json.dumps(report))
"""


def _probe(pythonpath: str, cwd: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", ENV_VAR)}
    env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _check_probe(report: dict, where: Path) -> None:
    for name, path in report["files"].items():
        assert Path(path).resolve().is_relative_to(where.resolve()), (name, path)
    assert report["clients_imported"] == [], "importing the integrations imported a client"
    assert report["sdpa_unchanged"], "importing the integrations changed torch's SDPA"
    for client, (kind, name, message) in report["errors"].items():
        assert kind in ("ImportError", "ModuleNotFoundError") and name == client, report["errors"]
        assert f"needs the {client} package" in message and f"pip install {client}" in message, message
    assert set(report["errors"]) == {"transformers", "diffusers"}


def test_the_wheels_packages_list_the_integrations():
    """pyproject.toml's package list (setuptools' find, as the build runs it) holds the subpackage."""
    tomllib = pytest.importorskip("tomllib")
    from setuptools import find_packages

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    found = find_packages(str(ROOT), include=config["include"], exclude=config.get("exclude", ()))
    assert "sageattention.integrations" in found
    assert not [p for p in found if p.startswith(("example", "tests", "bench"))]


def test_the_checkout_imports_without_clients_or_side_effects(tmp_path):
    _check_probe(_probe(str(ROOT), tmp_path), ROOT / "sageattention")


def test_the_integrations_import_from_an_installed_wheel(tmp_path):
    """The pure-Python wheel, built from a copy of the sources and installed with pip --target: the
    integrations import from there (not from the checkout), and need nothing under example/."""
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")
    src.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md", "build-matrix.yaml"):
        shutil.copy(ROOT / name, src / name)
    for name in ("sagebuild", "sageattention"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["SAGEATTENTION_BUILD_CUDA"] = "0"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    built = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w",
                            str(tmp_path / "wheels"), str(src)], cwd=src, env=env, capture_output=True,
                           text=True, timeout=600)  # fmt: skip
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-3000:]
    (wheel,) = (tmp_path / "wheels").glob("sageattention-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for module in MODULES:
        assert module.replace(".", "/") + ".py" in names, names
    assert "sageattention/integrations/__init__.py" in names
    assert not [n for n in names if n.startswith("example/")]
    target = tmp_path / "site"
    installed = subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(target),
                                str(wheel)], cwd=tmp_path, env=env, capture_output=True, text=True,
                               timeout=600)  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-3000:]
    _check_probe(_probe(str(target), tmp_path), target)


@pytest.mark.parametrize("module", sorted(CLIENTS))
def test_each_integration_names_its_missing_client(module, monkeypatch):
    integration = importlib.import_module(module)
    client = CLIENTS[module]
    monkeypatch.setitem(sys.modules, client, None)  # as if it were not installed
    use = integration.register if client == "transformers" else lambda: integration.sage_processors(object())
    with pytest.raises(ImportError, match=f"needs the {client} package") as raised:
        use()
    assert raised.value.name == client and integration.CHECKED_WITH[client] in str(raised.value)


@pytest.mark.parametrize("module", MODULES)
def test_each_integration_states_the_versions_it_was_checked_with(module):
    integration = importlib.import_module(module)
    assert integration.CHECKED_WITH and all(integration.CHECKED_WITH.values())
    for client, versions in integration.CHECKED_WITH.items():
        assert client in integration.__doc__ and versions.split(",")[0] in integration.__doc__, module


def test_importing_the_integrations_leaves_torch_alone():
    import sageattention.integrations.sdpa  # noqa: F401

    assert not isinstance(F.scaled_dot_product_attention, sageattention.integrations.sdpa.SageSDPA)


DOCUMENTED = {
    "sageattention.integrations.sdpa": ("install", "uninstall", "patched", "installed", "unpatched",
                                        "patch_from_env", "format_calls", "SageSDPA"),
    "sageattention.integrations.transformers": ("register", "calls", "reset", "sageattn_attention_forward"),
    "sageattention.integrations.diffusers": ("sage_processor", "sage_processors"),
}  # fmt: skip


def test_api_md_documents_every_integration_and_its_options():
    import inspect

    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    section = text[text.index("\n## Integrations\n") :]
    section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section
    for module, names in DOCUMENTED.items():
        assert f"### `{module}`" in section, module
        integration = importlib.import_module(module)
        for name in names:
            assert f"`{name}" in section or f"{name}(" in section, (module, name)
            assert hasattr(integration, name), (module, name)
    from sageattention.integrations import sdpa, transformers

    for fn in (sdpa.SageSDPA, transformers.register):
        for param in list(inspect.signature(fn).parameters)[1:]:
            assert f"{param}=" in section, (fn.__name__, param)
    assert "SAGEATTENTION_PATCH_SDPA" in section and "python -m sageattention run" in section
