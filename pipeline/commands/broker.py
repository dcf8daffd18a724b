"""``pipeline broker``: the embedded development broker in the foreground."""

from __future__ import annotations

import argparse
import sys

from pipeline.commands._args import Subparsers, server_flags
from pipeline.core.settings import Settings

__all__ = ["register", "run"]


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser("broker", parents=[common], help="run the embedded development broker")
    server_flags(parser, 9092)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, _settings: Settings) -> int:
    import signal
    import threading

    from pipeline.kafka.broker import EmbeddedBroker

    broker = EmbeddedBroker(args.host, args.port, quiet=not args.verbose).start()
    print(f"embedded broker on {broker.bootstrap_servers}; Ctrl-C stops it", file=sys.stderr)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        while not done.wait(0.5):
            if broker.process is None or broker.process.poll() is not None:
                print("error: the broker exited", file=sys.stderr)
                return 1
    except KeyboardInterrupt:
        pass
    finally:
        broker.stop()
    return 0
