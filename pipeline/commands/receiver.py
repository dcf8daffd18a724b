"""``pipeline receiver``: a webhook receiver that verifies X-Signature and prints calls."""

from __future__ import annotations

import argparse
import sys

from pipeline.commands._args import Subparsers, server_flags
from pipeline.core.settings import Settings

__all__ = ["register", "run"]


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser(
        "receiver", parents=[common], help="a webhook receiver that prints calls"
    )
    server_flags(parser, 8090)
    parser.add_argument(
        "--secret",
        action="append",
        default=[],
        help="shared secret: verify X-Signature and Standard Webhooks (401 when wrong); give it "
        "twice during a rotation (new and old): either verifies",
    )
    parser.add_argument(
        "--public-key",
        help="Ed25519 public key (whpk_…, config show): verify the v1a signature (401 when wrong)",
    )
    parser.add_argument("--status", type=int, default=200, help="status to answer (default 200)")
    parser.add_argument("--body", action="store_true", help="print each body too")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, _settings: Settings) -> int:
    from aiohttp import web

    from pipeline.http.receiver import make_receiver_app

    app = make_receiver_app(
        secrets=args.secret, public_key=args.public_key, status=args.status, verbose=args.body
    )
    print(f"receiver on http://{args.host}:{args.port}/ (any path)", file=sys.stderr)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)
    return 0
