"""User-facing errors: every message names the value, the rule and the fix.

The CLI turns these into a one-line message and exit code 2; anything else is an
internal error (exit code 1).
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input: a value, a file or a combination of options that cannot work."""


class MissingArtefactError(InputError, FileNotFoundError):
    """A step needs an artefact that an earlier command writes and that is not there yet."""
