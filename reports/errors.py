"""The report's errors: each message says what to run or pass instead."""

from __future__ import annotations


class ReportError(ValueError):
    """A run folder or an option the report cannot be built from; the message says the fix."""


class MissingResultsError(ReportError, FileNotFoundError):
    """The run has no search results yet (or lacks another file the report cannot do without)."""
