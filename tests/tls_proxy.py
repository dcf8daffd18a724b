"""A TLS-terminating proxy (Debian's stunnel4) in front of the embedded broker, for the tests of
secured Kafka: plain helpers, no fixtures.

The embedded broker serves no TLS itself, so it listens on a plain port and advertises the
proxy's: every client, after bootstrapping through the proxy, keeps talking TLS to it.

    certs = Certificates.make(tmp_path)        # a CA (trustme), a server and a client cert
    broker = EmbeddedBroker(port=0, advertised_port=tls_port)
    proxy = TlsProxy(tls_port, broker.port, certs, require_client_cert=True).start()
    ...
    proxy.stop(); broker.stop()                # each ends the process it started, by PID
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import trustme

from pipeline.runtime.net import port_open

__all__ = ["Certificates", "TlsProxy", "stunnel_binary"]


def stunnel_binary() -> str | None:
    return shutil.which("stunnel4") or shutil.which("stunnel")


@dataclass(frozen=True)
class Certificates:
    """PEM files: ``ca`` (the test CA), ``server_cert``/``server_key`` (127.0.0.1, localhost),
    ``client_cert``/``client_key`` (signed by the CA), ``other_ca`` (a CA that signed nothing)."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str

    @classmethod
    def make(cls, folder: Path) -> Certificates:
        folder.mkdir(parents=True, exist_ok=True)
        ca, other = trustme.CA(), trustme.CA()
        server = ca.issue_cert("127.0.0.1", "localhost")
        client = ca.issue_cert("pipeline-client@example.com")
        paths = {
            name: str(folder / f"{name}.pem")
            for name in ("ca", "server_cert", "server_key", "client_cert", "client_key", "other_ca")
        }
        ca.cert_pem.write_to_path(paths["ca"])
        other.cert_pem.write_to_path(paths["other_ca"])
        server.cert_chain_pems[0].write_to_path(paths["server_cert"])
        server.private_key_pem.write_to_path(paths["server_key"])
        client.cert_chain_pems[0].write_to_path(paths["client_cert"])
        client.private_key_pem.write_to_path(paths["client_key"])
        for name in ("server_key", "client_key"):
            Path(paths[name]).chmod(0o600)
        return cls(**paths)


class TlsProxy:
    """stunnel accepting TLS on ``127.0.0.1:port`` and forwarding plain TCP to ``target``;
    with ``require_client_cert`` it accepts only clients with a certificate of the test CA."""

    def __init__(
        self,
        port: int,
        target: int,
        certs: Certificates,
        *,
        require_client_cert: bool = False,
        folder: Path,
    ) -> None:
        self.port = port
        self.target = target
        self.certs = certs
        self.require_client_cert = require_client_cert
        self.folder = folder
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> TlsProxy:
        binary = stunnel_binary()
        if binary is None:
            raise RuntimeError("stunnel4 is not installed (tests/setup_system.sh installs it)")
        lines = [
            "foreground = yes",
            "pid =",
            "syslog = no",
            "debug = 3",
            "[kafka]",
            f"accept = 127.0.0.1:{self.port}",
            f"connect = 127.0.0.1:{self.target}",
            f"cert = {self.certs.server_cert}",
            f"key = {self.certs.server_key}",
        ]
        if self.require_client_cert:
            lines += [f"CAfile = {self.certs.ca}", "verifyChain = yes"]
        conf = self.folder / f"stunnel-{self.port}.conf"
        conf.write_text("\n".join(lines) + "\n")
        self.process = subprocess.Popen(
            [binary, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        while not port_open("127.0.0.1", self.port):
            if self.process.poll() is not None:
                raise RuntimeError(f"stunnel exited at start with code {self.process.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"stunnel did not listen on {self.port} within {timeout} s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
