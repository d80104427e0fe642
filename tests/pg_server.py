"""A real PostgreSQL server for the tests: ``AGENT_TEST_PG_DSN``, or one this starts.

It runs the distribution's ``initdb`` and ``pg_ctl`` (Debian's ``postgresql``
package, which ``.ci/run`` installs) on a free port on loopback, its data in
a temporary folder; as root it runs them as the ``postgres`` user, since the
server refuses to run as root. ``stop()``/``start()`` stop and start the same
server (the tests of an outage), ``close()`` removes it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

PG_DSN_ENV = "AGENT_TEST_PG_DSN"


def pg_bin(name: str) -> str | None:
    """The server program ``name``: on PATH, or in Debian's versioned folder."""
    found = shutil.which(name)
    if found:
        return found
    root = Path("/usr/lib/postgresql")
    for version in sorted(root.iterdir(), reverse=True) if root.is_dir() else []:
        candidate = version / "bin" / name
        if candidate.exists():
            return str(candidate)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def database_dsn(server_dsn: str, database: str) -> str:
    """``server_dsn`` with its database replaced by ``database``."""
    parts = urlsplit(server_dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, parts.fragment))


class LocalPostgres:
    """One PostgreSQL server in a temporary folder, on a free loopback port."""

    def __init__(self) -> None:
        initdb, pg_ctl = pg_bin("initdb"), pg_bin("pg_ctl")
        if initdb is None or pg_ctl is None:
            raise RuntimeError(
                f"no PostgreSQL server programs here (apt-get install postgresql), and {PG_DSN_ENV} is unset"
            )
        self.pg_ctl = pg_ctl
        self.folder = Path(tempfile.mkdtemp(prefix="agent-pg-"))
        self.data = self.folder / "data"
        self.port = _free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            self.as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.folder, "postgres", "postgres")
        self._run(
            [initdb, "-D", str(self.data), "-U", "agent", "--auth=trust", "-E", "UTF8", "--no-sync"],
        )
        self.start()

    def _run(self, args: list[str]) -> None:
        done = subprocess.run([*self.as_user, *args], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stderr.strip()}")

    @property
    def dsn(self) -> str:
        return f"postgresql://agent@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder} -c fsync=off"
        self._run(
            [self.pg_ctl, "-D", str(self.data), "-o", options, "-l", str(self.folder / "log"), "-w", "start"]
        )

    def stop(self) -> None:
        self._run([self.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop"])

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
