"""The ``pipeline`` command (also ``python -m pipeline``).

Every command takes ``--bootstrap-servers`` (env ``PIPELINE_BOOTSTRAP_SERVERS``) and
``--topic-prefix`` (env ``PIPELINE_TOPIC_PREFIX``); timing knobs are environment settings
(``PIPELINE_RETRY_DELAYS``, ``PIPELINE_RETRY_DEADLINE``, ``PIPELINE_DELIVERY_TIMEOUT``).
Exit codes: 0 success, 1 some input rejected or a check failed, 2 usage or config error,
3 Kafka or the Schema Registry unavailable.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from pipeline.core.exceptions import BrokerUnavailable, ConfigError, InvalidCall, PipelineError
from pipeline.core.settings import Settings
from pipeline.kafka.registry_codec import SchemaRegistryUnavailable

__all__ = ["main"]

log = logging.getLogger("pipeline")


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("Kafka")
    group.add_argument(
        "--bootstrap-servers",
        metavar="HOST:PORT",
        help="Kafka bootstrap servers (env PIPELINE_BOOTSTRAP_SERVERS, default 127.0.0.1:9092)",
    )
    group.add_argument(
        "--topic-prefix",
        metavar="PREFIX",
        help="prefix of every topic and consumer group (env PIPELINE_TOPIC_PREFIX, default none)",
    )
    common.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return common


def _server(parser: argparse.ArgumentParser, port: int) -> None:
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default %(default)s)"
    )
    parser.add_argument("--port", type=int, default=port, help="port (default %(default)s)")


def _metrics_port(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port", type=int, default=None, help="serve Prometheus /metrics on this port"
    )


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(
        prog="pipeline",
        description="Analytics calls on Kafka, delivered as signed webhooks.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    dev = sub.add_parser(
        "dev", parents=[common], help="run everything locally on the embedded broker"
    )
    dev.add_argument("--receiver-port", type=int, default=8090)
    dev.add_argument("--broker-port", type=int, default=9092)
    dev.add_argument("--ingest-port", type=int, default=8080)

    broker = sub.add_parser("broker", parents=[common], help="run the embedded development broker")
    _server(broker, 9092)

    topics = sub.add_parser("topics", parents=[common], help="manage topics")
    topics_sub = topics.add_subparsers(dest="action", required=True, metavar="ACTION")
    topics_sub.add_parser(
        "create", parents=[common], help="create or check every topic (idempotent)"
    )

    config = sub.add_parser("config", parents=[common], help="sources and destinations")
    config_sub = config.add_subparsers(dest="action", required=True, metavar="ACTION")
    apply = config_sub.add_parser(
        "apply", parents=[common], help="validate and publish a config file"
    )
    apply.add_argument("file", help="YAML file with sources and destinations ('-' for stdin)")
    apply.add_argument("--dry-run", action="store_true", help="validate and show the plan only")
    apply.add_argument(
        "--no-prune",
        action="store_true",
        help="keep sources and destinations that the file does not list (default: delete them)",
    )
    show = config_sub.add_parser("show", parents=[common], help="print the live config")
    show.add_argument("--json", action="store_true", help="JSON output")
    show.add_argument("--show-secrets", action="store_true", help="print secrets unmasked")

    for role, text in (
        ("router", "route calls to destinations"),
        ("deliver", "deliver webhooks"),
        ("retry", "retry failed deliveries from the tier topics"),
        ("worker", "router, deliver and retry in one process"),
    ):
        p = sub.add_parser(role, parents=[common], help=text)
        _metrics_port(p)

    send = sub.add_parser(
        "send", parents=[common], help="produce Segment-format calls from a JSONL file"
    )
    send.add_argument("file", help="one JSON call per line ('-' for stdin)")
    who = send.add_mutually_exclusive_group()
    who.add_argument("--write-key", help="write key of the source (a line's own writeKey wins)")
    who.add_argument("--source", help="source id, instead of a write key")
    send.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)

    dlq = sub.add_parser("dlq", parents=[common], help="inspect and replay dead letters")
    dlq_sub = dlq.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, text in (("list", "show dead letters"), ("replay", "re-enqueue dead letters")):
        p = dlq_sub.add_parser(action, parents=[common], help=text)
        p.add_argument("--destination", help="only this destination id")
        p.add_argument("--reason", help="only this reason (e.g. deadline_exceeded, client_error)")
        p.add_argument("--since", help="dead-lettered at or after: ISO time or a duration ago (2h)")
        p.add_argument("--until", help="dead-lettered at or before: ISO time or a duration ago")
        if action == "list":
            p.add_argument("--json", action="store_true", help="JSON lines output")
        else:
            p.add_argument("--dry-run", action="store_true", help="show what would be replayed")

    delete = sub.add_parser(
        "delete-user", parents=[common], help="a deletion request (delete calls)"
    )
    delete.add_argument("user_id", metavar="USER_ID", help="the user to delete")
    delete.add_argument("--reason", help="why (recorded with the request)")
    delete.add_argument(
        "--force", action="store_true", help="notify already notified sources again"
    )
    delete.add_argument("--status", action="store_true", help="show what the requests sent")
    for name, column, text in (
        ("audience", "--members", "FILE: one user id per line, or CSV with a user_id column"),
        ("traits", "--values", "FILE: CSV user_id,value (12 → number, true → boolean)"),
    ):
        group = sub.add_parser(name, parents=[common], help=f"{name} syncs (identify calls)")
        sync = group.add_subparsers(dest="action", required=True, metavar="ACTION").add_parser(
            "sync", parents=[common], help="send identify calls for what changed since last sync"
        )
        sync.add_argument("--source", required=True, help="source id the calls belong to")
        sync.add_argument("--name", required=True, help='e.g. "Order Completed Last 30days"')
        sync.add_argument(column, required=True, metavar="FILE", help=text + " ('-': stdin)")
        sync.add_argument("--dry-run", action="store_true", help="show the changes, send nothing")
        sync.add_argument(
            "--allow-empty", action="store_true", help="accept a file with no users (removes all)"
        )
        sync.add_argument("--json", action="store_true", help="print the summary as JSON")
        sync.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)

    ingest = sub.add_parser(
        "ingest", parents=[common], help="the HTTP ingestion API (Segment-compatible, /metrics too)"
    )
    _server(ingest, 8080)
    ingest.add_argument(
        "--ack-timeout",
        metavar="DURATION",
        help="answer 503 when Kafka has not acknowledged within this (env "
        "PIPELINE_INGEST_ACK_TIMEOUT, default 10s)",
    )

    receiver = sub.add_parser(
        "receiver", parents=[common], help="a webhook receiver that prints calls"
    )
    _server(receiver, 8090)
    receiver.add_argument("--secret", help="shared secret: verify X-Signature (401 when wrong)")
    receiver.add_argument("--status", type=int, default=200, help="status to answer (default 200)")
    receiver.add_argument("--body", action="store_true", help="print each body too")
    return parser


def settings_from(args: argparse.Namespace) -> Settings:
    settings = Settings.from_env()
    changes: dict[str, object] = {}
    if getattr(args, "bootstrap_servers", None):
        changes["bootstrap_servers"] = args.bootstrap_servers
    if getattr(args, "topic_prefix", None) is not None:
        changes["topic_prefix"] = args.topic_prefix
    return settings.replace(**changes) if changes else settings


def _configure_logging(verbose: bool) -> None:
    debug = verbose or "analytics" in os.environ.get("DEBUG", "").split(",")
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not debug:
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
        logging.getLogger("pipeline.rdkafka").setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(args.verbose)
    try:
        settings = settings_from(args)
        return _dispatch(args, settings)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except InvalidCall as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SchemaRegistryUnavailable as exc:
        print(f"error: Schema Registry unavailable: {exc}", file=sys.stderr)
        return 3
    except BrokerUnavailable as exc:
        print(f"error: Kafka unavailable: {exc}", file=sys.stderr)
        return 3
    except (PipelineError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace, settings: Settings) -> int:
    command = args.command
    if command == "dev":
        from pipeline.commands.dev import run_dev

        run_dev(
            settings,
            receiver_port=args.receiver_port,
            broker_port=args.broker_port,
            ingest_port=args.ingest_port,
        )
        return 0
    if command == "broker":
        return _broker(args)
    if command == "topics":
        return _topics_create(settings)
    if command == "config":
        return (
            _config_apply(args, settings)
            if args.action == "apply"
            else _config_show(args, settings)
        )
    if command in ("router", "deliver", "retry", "worker"):
        from pipeline.roles.worker import ROLES, run_roles_until_signalled
        from pipeline.runtime.metrics import serve_metrics

        serve_metrics(args.metrics_port)
        run_roles_until_signalled(settings, ROLES if command == "worker" else (command,))
        return 0
    if command == "send":
        return _send(args, settings)
    if command == "ingest":
        from pipeline.core.durations import parse_duration
        from pipeline.http.ingest import IngestOptions, run_ingest

        options = IngestOptions.from_env()
        if args.ack_timeout:
            options = IngestOptions(
                ack_timeout=parse_duration(args.ack_timeout, name="--ack-timeout")
            )
        run_ingest(settings, args.host, args.port, options, access_log=args.verbose)
        return 0
    if command == "receiver":
        return _receiver(args)
    if command == "dlq":
        return _dlq(args, settings)
    if command == "delete-user":
        from pipeline.ops.deletion import run_delete_user

        return run_delete_user(args, settings)
    if command in ("audience", "traits"):
        from pipeline.ops.audience_sync import run_audience_sync, run_traits_sync

        return (run_audience_sync if command == "audience" else run_traits_sync)(args, settings)
    raise AssertionError(command)


def _broker(args: argparse.Namespace) -> int:
    import signal
    import threading

    from pipeline.kafka.broker import EmbeddedBroker

    broker = EmbeddedBroker(args.host, args.port, quiet=not args.verbose).start()
    print(
        f"embedded broker on {broker.bootstrap_servers}; Ctrl-C stops it",
        file=sys.stderr,
    )
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


def _topics_create(settings: Settings) -> int:
    from pipeline.kafka.clients import create_topics, wait_for_broker

    wait_for_broker(settings, timeout=30)
    for topic, status in sorted(create_topics(settings).items()):
        print(f"{topic:<50} {status}")
    return 0


def _read_yaml(path: str) -> object:
    text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()  # noqa: SIM115
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML: {exc}"]) from None


def _config_apply(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.core.config import validate_config
    from pipeline.kafka.config_store import apply_config

    config = validate_config(_read_yaml(args.file))
    for warning in _blocked_url_warnings(config, settings):
        print(f"warning: {warning}", file=sys.stderr)
    plan = apply_config(settings, config, prune=not args.no_prune, dry_run=args.dry_run)
    verb = "would" if args.dry_run else ""
    for label, keys in (
        ("create", plan.created),
        ("update", plan.updated),
        ("delete", plan.deleted),
    ):
        for key in keys:
            print(f"{(verb + ' ' + label).strip():<14} {key}")
    print(
        f"{'dry run: ' if args.dry_run else ''}{len(plan.created)} created, {len(plan.updated)} updated, "
        f"{len(plan.deleted)} deleted, {len(plan.unchanged)} unchanged"
    )
    return 0


def _blocked_url_warnings(config: Any, settings: Settings) -> list[str]:
    """Webhook URLs whose host resolves to an address the SSRF guard refuses (best effort, 3 s)."""
    import concurrent.futures
    import socket
    from urllib.parse import urlsplit

    from pipeline.core.address_policy import AddressPolicy

    policy = AddressPolicy.parse(settings.allowed_networks)

    def refusals(host: str) -> list[str]:
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        except OSError:
            return []  # unresolvable here; the worker decides at delivery time
        found = {str(policy.refusal(str(info[4][0]))) for info in infos}
        return sorted(found) if all(policy.refusal(str(i[4][0])) for i in infos) else []

    where: dict[str, list[str]] = {}
    for index, dest in enumerate(config.destinations):
        for number, hook in enumerate(dest.webhooks):
            host = urlsplit(hook.url).hostname or ""
            where.setdefault(host, []).append(
                f"destinations[{index}] ({dest.id}).webhooks[{number}].url"
            )
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=8)
    futures = {host: pool.submit(refusals, host) for host in where}
    done, _ = concurrent.futures.wait(futures.values(), timeout=3)
    pool.shutdown(wait=False, cancel_futures=True)
    warnings = []
    for host, future in futures.items():
        if future in done and future.result():
            for field in where[host]:
                warnings.append(
                    f"{field}: {host} resolves to blocked addresses ({'; '.join(future.result())}); "
                    "deliveries will be dead-lettered as blocked_address unless "
                    "PIPELINE_ALLOWED_NETWORKS allows them"
                )
    return warnings


def _mask(secret: str | None, show: bool) -> str | None:
    if secret is None or show:
        return secret
    return "••••" + (secret[-2:] if len(secret) >= 8 else "")


def _config_show(args: argparse.Namespace, settings: Settings) -> int:
    import orjson

    from pipeline.kafka.config_store import load_table

    table = load_table(settings)
    data: dict[str, list[dict[str, Any]]] = {
        "sources": [
            {
                "id": s.id,
                "name": s.name,
                "write_keys": [_mask(k, args.show_secrets) for k in s.write_keys],
                "blocked_events": s.blocked_events,
            }
            for s in sorted(table.sources.values(), key=lambda s: s.id)
        ],
        "destinations": [
            {
                "id": d.id,
                "name": d.name,
                "enabled": d.enabled,
                "sources": d.sources,
                "shared_secret": _mask(d.shared_secret, args.show_secrets),
                "webhooks": [
                    {
                        "url": w.url,
                        "headers": {k: _mask(v, args.show_secrets) for k, v in w.headers.items()},
                    }
                    for w in d.webhooks
                ],
            }
            for d in sorted(table.destinations.values(), key=lambda d: d.id)
        ],
    }
    if args.json:
        print(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
        return 0
    print(f"{'SOURCE':<20} {'NAME':<24} {'WRITE KEYS':<10} BLOCKED EVENTS")
    for s in data["sources"]:
        print(
            f"{s['id']:<20} {s['name']:<24} {len(s['write_keys']):<10} "
            f"{', '.join(s['blocked_events']) or '-'}"
        )
    print()
    print(f"{'DESTINATION':<20} {'NAME':<12} {'ENABLED':<8} {'SOURCES':<16} {'SIGNED':<7} WEBHOOKS")
    for d in data["destinations"]:
        urls = ", ".join(w["url"] for w in d["webhooks"])
        print(
            f"{d['id']:<20} {d['name']:<12} {'yes' if d['enabled'] else 'no':<8} "
            f"{','.join(d['sources']):<16} {'yes' if d['shared_secret'] else 'no':<7} {urls}"
        )
    return 0


def _send(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.ops.send import open_input, send_lines

    with open_input(args.file) as lines:
        summary = send_lines(
            settings, lines, write_key=args.write_key, source_id=args.source, progress=args.progress
        )
    for number, problem in summary.rejected:
        print(f"line {number}: {problem}", file=sys.stderr)
    for problem in summary.failed:
        print(f"kafka refused a call: {problem}", file=sys.stderr)
    rate = summary.sent / summary.seconds if summary.seconds else 0.0
    print(
        f"sent {summary.sent} calls, rejected {len(summary.rejected)} lines, "
        f"{len(summary.failed)} failed ({rate:,.0f} calls/s)",
        file=sys.stderr,
    )
    return 0 if summary.ok else 1


def _dlq(args: argparse.Namespace, settings: Settings) -> int:
    import orjson

    from pipeline.ops.dlq import (
        DlqFilter,
        describe_time,
        list_dead_letters,
        parse_when,
        replay_dead_letters,
    )

    selection = DlqFilter(
        destination=args.destination,
        reason=args.reason,
        since=parse_when(args.since) if args.since else None,
        until=parse_when(args.until) if args.until else None,
    )
    if args.action == "replay":
        summary = replay_dead_letters(settings, selection, dry_run=args.dry_run)
        verb = "would replay" if args.dry_run else "replayed"
        for entry in summary.replayed:
            delivery = entry.letter["delivery"]
            print(
                f"{verb} {delivery['destinationId']} {delivery['messageId']} ({entry.letter['reason']})"
            )
        print(
            f"{verb} {len(summary.replayed)}; skipped {summary.already_replayed} already replayed, "
            f"{summary.not_replayable} not replayable (undecodable)"
        )
        return 0
    entries = list_dead_letters(settings, selection)
    if args.json:
        for entry in entries:
            letter = dict(entry.letter)
            delivery = letter.get("delivery")
            if delivery is not None:
                delivery = dict(delivery, body=delivery["body"].decode("utf-8", "replace"))
            letter["delivery"] = delivery
            letter["raw"] = None if letter["raw"] is None else letter["raw"].hex()
            letter["replayedAt"] = entry.replayed_at
            print(orjson.dumps(letter).decode())
        return 0
    print(
        f"{'DEAD-LETTERED (UTC)':<20} {'REASON':<20} {'DESTINATION':<16} {'MESSAGE ID':<38} "
        f"{'TRIES':<5} {'REPLAYED':<8} LAST ERROR"
    )
    for entry in entries:
        letter = entry.letter
        delivery = letter["delivery"] or {}
        attempts = delivery.get("attempts") or []
        last = attempts[-1] if attempts else None
        error = (
            "-"
            if last is None
            else (f"HTTP {last['status']}" if last["status"] is not None else str(last["error"]))
        )
        tries = len({a["at"] for a in attempts})
        print(
            f"{describe_time(letter['deadLetteredAt']):<20} {letter['reason']:<20} "
            f"{delivery.get('destinationId', '-'):<16} {delivery.get('messageId', '-'):<38} "
            f"{tries:<5} {'yes' if entry.replayed_at else 'no':<8} {error[:60]}"
        )
    print(f"{len(entries)} dead letters")
    return 0


def _receiver(args: argparse.Namespace) -> int:
    from aiohttp import web

    from pipeline.http.receiver import make_receiver_app

    app = make_receiver_app(secret=args.secret, status=args.status, verbose=args.body)
    print(f"receiver on http://{args.host}:{args.port}/ (any path)", file=sys.stderr)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
