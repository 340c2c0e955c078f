"""Every relative link of the repository's Markdown files (README.md, docs/, bench/NOTES.md, ...) names
a file or folder that git tracks: a benchmark figure quoted with its JSON, a document pointing at
another. Checked against git's index, so that a result file written but not committed fails here
before a fresh clone would show the dead link."""

from __future__ import annotations

import posixpath
import re
import subprocess
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _tracked() -> set[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = {f for f in out.decode().split("\0") if f}
    folders = {str(parent) for f in files for parent in PurePosixPath(f).parents if str(parent) != "."}
    return files | folders


def _links(markdown: str) -> list[str]:
    """The relative targets of a Markdown file's inline links, anchors dropped."""
    targets = []
    for target in LINK.findall(markdown):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or a link within the page
        targets.append(target.split("#", 1)[0])
    return targets


def test_link_pattern_reads_targets():
    text = "see [a](bench/x.json), [b](https://example.org/y), [c](#top), [d](docs/api.md#sageattn)"
    assert _links(text) == ["bench/x.json", "docs/api.md"]


def test_every_relative_link_names_a_tracked_path():
    tracked = _tracked()
    pages = sorted(f for f in tracked if f.endswith(".md"))
    assert "README.md" in pages
    dead = []
    for page in pages:
        base = PurePosixPath(page).parent
        for target in _links((ROOT / page).read_text(encoding="utf-8")):
            if posixpath.normpath(str(base / target)) not in tracked:
                dead.append(f"{page}: {target}")
    assert not dead, "links to paths git does not track:\n  " + "\n  ".join(dead)
