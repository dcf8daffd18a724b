"""A throwaway PostgreSQL server for the tests and the benchmark: plain helpers, no fixtures.

    server = start_postgres()            # initdb + postgres on a free 127.0.0.1 port
    url = server.create_database("t1")   # postgresql://postgres@127.0.0.1:PORT/t1
    server.stop()                        # ends the postmaster we started (by its PID), removes
                                         # the data directory

Uses Debian's server binaries (``/usr/lib/postgresql/<version>/bin``, the newest version found;
``tests/setup_system.sh`` installs the package) or ``initdb`` on the PATH. Tuned for speed, not
durability (``fsync=off``, no full-page writes): the data is thrown away. PostgreSQL refuses to
run as root, so as root the server runs as the ``postgres`` system user (the Debian package makes
it), with a data directory that user owns, made under the system temp directory (pytest's temp
directories are private to root).
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.runtime.net import free_port

__all__ = ["PostgresServer", "find_postgres_bin", "start_postgres"]

#: Seconds to wait for the server to accept connections.
START_TIMEOUT = 60.0
SUPERUSER = "postgres"
SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "50",
    "shared_buffers": "256MB",
    "max_wal_size": "4GB",
    "checkpoint_timeout": "30min",
    "log_min_messages": "warning",
}


def find_postgres_bin() -> Path | None:
    """The directory holding ``initdb`` and ``postgres`` (the newest Debian version), or None."""
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    if found:

        def version(path: str) -> tuple[int, ...]:
            number = Path(path).parent.parent.name
            return tuple(int(p) for p in re.findall(r"\d+", number))

        return Path(max(found, key=version)).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@dataclass
class PostgresServer:
    base: Path
    """Holds ``data/``, the unix socket and ``server.log``; removed by ``stop``."""
    port: int
    process: subprocess.Popen[bytes]
    bin_dir: Path

    @property
    def host(self) -> str:
        return "127.0.0.1"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@{self.host}:{self.port}/{database}"

    def log_tail(self, lines: int = 30) -> str:
        log = self.base / "server.log"
        return (
            "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""
        )

    def create_database(self, name: str) -> str:
        """A new empty database; its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        """Fast shutdown of the postmaster we started (SIGINT to its PID), then SIGKILL if it
        lingers; the data directory goes with it."""
        if self.process.poll() is None:
            self.process.send_signal(2)  # SIGINT: PostgreSQL's fast shutdown
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        shutil.rmtree(self.base, ignore_errors=True)


def _as_server_user() -> dict[str, object]:
    """Popen options that run a command as the ``postgres`` user when we are root."""
    if os.geteuid() != 0:
        return {}
    try:
        account = pwd.getpwnam(SUPERUSER)
    except KeyError:
        raise RuntimeError(
            "running as root, and there is no 'postgres' user to run PostgreSQL as "
            "(PostgreSQL refuses root): install Debian's postgresql package "
            "(bash tests/setup_system.sh) or run the tests as another user"
        ) from None
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def start_postgres(bin_dir: Path | None = None) -> PostgresServer:
    """A new cluster on a free port, accepting connections; ``RuntimeError`` if impossible."""
    bin_dir = bin_dir or find_postgres_bin()
    if bin_dir is None:
        raise RuntimeError(
            "no PostgreSQL server binaries (initdb): run `bash tests/setup_system.sh` as root "
            "(installs Debian's postgresql package) or put initdb on the PATH"
        )
    as_user = _as_server_user()
    base = Path(tempfile.mkdtemp(prefix="pipeline-pg-"))
    if as_user:
        os.chown(base, int(str(as_user["user"])), int(str(as_user["group"])))
    data = base / "data"
    log_path = base / "server.log"
    with open(log_path, "ab") as log:
        result = subprocess.run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=base,
            check=False,
            **as_user,
        )
    if result.returncode != 0:
        tail = log_path.read_text(errors="replace")[-2000:]
        shutil.rmtree(base, ignore_errors=True)
        raise RuntimeError(f"initdb failed ({result.returncode}):\n{tail}")
    port = free_port()
    options = [f"-c{name}={value}" for name, value in SETTINGS.items()]
    log = open(log_path, "ab")  # noqa: SIM115  (the server writes it until it stops)
    try:
        process = subprocess.Popen(
            [
                str(bin_dir / "postgres"),
                "-D",
                str(data),
                "-p",
                str(port),
                "-k",
                str(base),
                *options,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=base,
            start_new_session=True,  # Ctrl-C in the terminal reaches pytest, not the server
            **as_user,
        )
    finally:
        log.close()
    server = PostgresServer(base, port, process, bin_dir)
    try:
        _wait_accepting(server)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_accepting(server: PostgresServer) -> None:
    import psycopg

    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"postgres exited with {server.process.returncode}:\n{server.log_tail()}"
            )
        try:
            psycopg.connect(server.url(), connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"postgres did not accept connections within {START_TIMEOUT:.0f} s:\n"
                    f"{server.log_tail()}"
                ) from None
            time.sleep(0.1)
