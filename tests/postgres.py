"""A real PostgreSQL server for tests: initdb + pg_ctl in a temporary folder, on a free port.

Debian's `postgresql` package puts its binaries in /usr/lib/postgresql/<version>/bin
(`.ci/run` installs it). PostgreSQL refuses to run as root, so as root the server runs
as the `postgres` user (`runuser`), in a folder it owns. It listens on 127.0.0.1 only
and on a socket in its own folder; `stop()` shuts it down and removes everything.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from familiar_bot.app.supervisor import free_port


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL's bin folder, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name)
                   if Path(p).parent.parent.name.isdigit() else 0)
    return Path(found[-1]).parent if found else None


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@dataclass
class PostgresServer:
    bin_dir: Path
    folder: Path
    port: int

    @property
    def data(self) -> Path:
        return self.folder / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """A new, empty database; its URL."""
        import psycopg2

        name = name or f"t_{uuid.uuid4().hex[:12]}"
        conn = psycopg2.connect(self.url())
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return self.url(name)

    def stop(self) -> None:
        subprocess.run(_as_postgres([str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"]),
                       capture_output=True, timeout=60)
        shutil.rmtree(self.folder, ignore_errors=True)


def start_postgres() -> PostgresServer:
    bin_dir = postgres_bin()
    if bin_dir is None:
        raise FileNotFoundError("no PostgreSQL binaries under /usr/lib/postgresql/*/bin (apt-get install -y postgresql)")
    folder = Path(tempfile.mkdtemp(prefix="familiar-pg-"))
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    server = PostgresServer(bin_dir, folder, free_port())
    try:
        subprocess.run(_as_postgres([str(bin_dir / "initdb"), "-D", str(server.data), "-A", "trust", "-U", "postgres",
                                     "--no-sync", "-E", "UTF8"]), check=True, capture_output=True, timeout=120)
        options = (f"-c listen_addresses=127.0.0.1 -p {server.port} -k {folder} -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        subprocess.run(_as_postgres([str(bin_dir / "pg_ctl"), "-D", str(server.data), "-o", options, "-l",
                                     str(folder / "postgres.log"), "-w", "-t", "60", "start"]),
                       check=True, capture_output=True, timeout=90)
    except BaseException:
        log = folder / "postgres.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        server.stop()
        if tail:
            print(tail)
        raise
    return server
