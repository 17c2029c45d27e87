"""Calling the real `dreams-nas` command line in-process, as the tests do."""

from __future__ import annotations

import contextlib
import io
import json

from dreams_nas.nas import cli


def call_cli(*argv: str) -> tuple[int, dict | None, str]:
    """(exit code, the --json summary or None, stderr) of one quiet `dreams-nas` call."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([*argv, "--json", "-q"])
    lines = out.getvalue().strip().splitlines()
    return code, (json.loads(lines[-1]) if code == 0 and lines else None), err.getvalue()
