"""Entry point for ``python -m sagebuild`` (from the checkout's root) and for
``python path/to/checkout/sagebuild`` (from any directory).

Run as a folder, this file is a top-level script: Python puts the sagebuild folder itself first on
sys.path (where its build.py would shadow the ``build`` package) and there is no parent package for
the relative imports. The checkout's root takes that place, so ``sagebuild`` imports as a package.
Every path sagebuild reads by default (build-matrix.yaml, the sources, .sagebuild/, wheelhouse/) is
found from the checkout, never from the working directory.
"""

import sys
from pathlib import Path

if not __package__:
    _here = Path(__file__).resolve().parent
    if sys.path and sys.path[0] and Path(sys.path[0]).resolve() == _here:
        sys.path[0] = str(_here.parent)
    else:
        sys.path.insert(0, str(_here.parent))
    from sagebuild.cli import main
else:
    from .cli import main

raise SystemExit(main())
