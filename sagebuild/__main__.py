"""Entry point for ``python -m sagebuild``."""

from .cli import main

raise SystemExit(main())
