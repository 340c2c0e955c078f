"""Errors that sagebuild reports to the user as one clear message (no traceback)."""

from __future__ import annotations


class SagebuildError(Exception):
    """A problem the user can fix; the CLI prints the message and exits non-zero."""

    exit_code = 1


class MatrixError(SagebuildError):
    """An invalid build-matrix.yaml, or a combination it does not allow."""

    exit_code = 2


class TagError(SagebuildError):
    """A wheel name or tag that does not follow our naming scheme."""

    exit_code = 2


class UsageError(SagebuildError):
    """Bad command-line input (unknown profile, missing argument, ...)."""

    exit_code = 2
