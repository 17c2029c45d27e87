"""A throw-away PostgreSQL server for tests: initdb in a temp folder, loopback port.

PostgreSQL refuses to run as root, so as root the server runs as the `postgres` user. The port
is a free one, asked of the OS; another process (a parallel test worker) may take it before the
server binds it, and then the server starts again on another.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def pg_bin() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(versions[-1]).parent if versions else None


def unavailable_reason() -> str | None:
    if pg_bin() is None:
        return "PostgreSQL is not installed (no pg_ctl; `.ci/run` installs Debian's postgresql)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without `runuser` to start PostgreSQL as the postgres user"
    try:
        import pwd

        if os.geteuid() == 0:
            pwd.getpwnam("postgres")
    except KeyError:
        return "running as root and there is no `postgres` user to run the server as"
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 is not installed (pip install -e '.[dev]')"
    return None


_PORT_ATTEMPTS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self) -> None:
        self.bin = pg_bin()
        assert self.bin is not None
        self.root = Path(tempfile.mkdtemp(prefix="dreams-nas-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.as_root = os.geteuid() == 0

    def _run(self, *cmd: str) -> subprocess.CompletedProcess:
        argv = [str(self.bin / cmd[0]), *cmd[1:]]
        if self.as_root:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120)

    def start(self) -> str:
        os.chmod(self.root, 0o777)
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "--no-sync", "-E", "UTF8")
        for attempt in range(_PORT_ATTEMPTS):
            opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                    "-c fsync=off -c max_connections=50")
            try:
                self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l",
                          str(self.root / "server.log"), "-w", "-t", "60", "start")
                break
            except subprocess.CalledProcessError:
                if attempt + 1 == _PORT_ATTEMPTS or not self._port_was_taken():
                    raise
                self.port = _free_port()
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                  "dreams")
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/dreams"

    def _port_was_taken(self) -> bool:
        try:
            logged = (self.root / "server.log").read_text(errors="replace")
        except OSError:
            return False
        return "could not bind" in logged or "already in use" in logged

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
