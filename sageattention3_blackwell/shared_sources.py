"""The files sageattn3 takes from the repository: the package-neutral half of the compiled modules' C ABI,
and the build pieces both packages' setup.py share.

sageattention and sageattn3 export the same plain C ABI from their compiled modules (tensor descriptors,
errors, the op signature, the version exports): its C side is one header, csrc/include/sage_cabi.h, and
its Python side one module, sageattention/_cabi.py (descriptor packing, ``Library``, loading). Their
setup.py build the modules the same way (sagebuild/sage_setup.py: settings, nvcc's version, the
extension, the build record, the abi3 tag). All three are kept once, in the repository, and copied into
this package's tree when it is built, at the paths of ``SHARED`` (git-ignored there); the wheel carries
the copy of _cabi.py (and a module compiled on the header), the sdist all three, so neither package
needs the other at run time, nor sageattn3's build sagebuild.

Why copies made by the build: a second copy kept by hand drifts from the first with the next change of
the ABI (a descriptor word, a dtype code, an export), and the drift shows only on a GPU, as garbage or a
crash; a checked-in generated copy would stand in the repository twice. A copy made from the one file
at every build cannot drift.

setup.py calls ``sync`` before it builds; so do the sageattn3 tests (tests/conftest.py), which import the
source tree. sagebuild stages the files at their repository paths next to the copy of the package it
builds (``shared_files`` of sageattn3 in build-matrix.yaml, which a unit test keeps equal to ``SHARED``),
so that ``sync`` finds them there as in the checkout. This module is not shipped.
"""

from __future__ import annotations

import os
from pathlib import Path

#: repository path -> path in sageattn3's tree
SHARED = {
    "csrc/include/sage_cabi.h": "csrc/shared/sage_cabi.h",
    "sageattention/_cabi.py": "sageattn3/_cabi.py",
    "sagebuild/sage_setup.py": "sage_setup.py",
}
PACKAGE_ROOT = Path(__file__).resolve().parent


def sync(package_root: Path = PACKAGE_ROOT) -> list[str]:
    """Copy the shared files from the repository (the folder above ``package_root``) into the package's
    tree where they differ; returns the paths it wrote. Outside a checkout (an sdist) the copies must be
    there already; FileNotFoundError says which is missing."""
    repository = package_root.parent
    written = []
    for source, target in SHARED.items():
        origin, copy = repository / source, package_root / target
        if not origin.is_file():
            if not copy.is_file():
                raise FileNotFoundError(
                    f"sageattn3 needs {source} of the repository (copied to {target}): neither is here; "
                    "build sageattn3 from a checkout of the repository or from its sdist"
                )
            continue
        data = origin.read_bytes()
        if copy.is_file() and copy.read_bytes() == data:
            continue
        copy.parent.mkdir(parents=True, exist_ok=True)
        # Written aside, then renamed: builds and test processes that sync at once never read half a file.
        draft = copy.with_name(f".{copy.name}.{os.getpid()}")
        draft.write_bytes(data)
        os.replace(draft, copy)
        written.append(target)
    return written


if __name__ == "__main__":
    print("\n".join(f"copied {path}" for path in sync()) or "the shared files are up to date")
