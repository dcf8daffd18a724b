"""``pipeline config apply FILE`` / ``config show``: validate and publish sources and destinations."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import yaml

from pipeline.commands._args import Subparsers
from pipeline.core.durations import format_duration
from pipeline.core.exceptions import ConfigError
from pipeline.core.settings import Settings
from pipeline.core.timestamps import format_timestamp

if TYPE_CHECKING:  # pydantic loads only for the commands that need it
    from pipeline.core.config import ConfigTable, Destination

__all__ = ["register", "run", "format_config"]


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser("config", parents=[common], help="sources and destinations")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    apply = actions.add_parser("apply", parents=[common], help="validate and publish a config file")
    apply.add_argument("file", help="YAML file with sources and destinations ('-' for stdin)")
    apply.add_argument("--dry-run", action="store_true", help="validate and show the plan only")
    apply.add_argument(
        "--no-prune",
        action="store_true",
        help="keep sources and destinations that the file does not list (default: delete them)",
    )
    show = actions.add_parser("show", parents=[common], help="print the live config")
    show.add_argument("--json", action="store_true", help="JSON output")
    show.add_argument("--show-secrets", action="store_true", help="print secrets unmasked")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    return _apply(args, settings) if args.action == "apply" else _show(args, settings)


def _read_yaml(path: str) -> object:
    text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()  # noqa: SIM115
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML: {exc}"]) from None


def _apply(args: argparse.Namespace, settings: Settings) -> int:
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


def _show(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.kafka.config_store import load_table

    print(format_config(load_table(settings), show_secrets=args.show_secrets, as_json=args.json))
    return 0


def _durations(seconds: Sequence[float] | None) -> list[str] | None:
    return None if seconds is None else [format_duration(s) for s in seconds]


def _duration(seconds: float | None) -> str | None:
    return None if seconds is None else format_duration(seconds)


def _destination_data(d: Destination, show_secrets: bool) -> dict[str, Any]:
    """One destination with the config file's keys, durations as text (``10s``, ``4h``)."""
    return {
        "id": d.id,
        "name": d.name,
        "enabled": d.enabled,
        "sources": d.sources,
        "shared_secret": _mask(d.shared_secret, show_secrets),
        "standard_webhooks": d.standard_webhooks,
        "webhooks": [
            {
                "url": w.url,
                "headers": {k: _mask(v, show_secrets) for k, v in w.headers.items()},
            }
            for w in d.webhooks
        ],
        "retry": None
        if d.retry is None
        else {"delays": _durations(d.retry.delays), "deadline": _duration(d.retry.deadline)},
        "max_in_flight": d.max_in_flight,
        "rate_limit": d.rate_limit,
        "disable_after": _duration(d.disable_after),
        "disabled_reason": d.disabled_reason,
        "disabled_at": d.disabled_at,
    }


def _policy_line(d: dict[str, Any]) -> str:
    """``retry 10s,1m,5m deadline 4h; max in flight 200; rate limit 50/s; disable after 24h``."""
    retry = d["retry"] or {}
    delays = ",".join(retry.get("delays") or []) or "default"
    deadline = retry.get("deadline") or "default"
    rate = "-" if d["rate_limit"] is None else f"{d['rate_limit']:g}/s"
    return (
        f"retry {delays} deadline {deadline}; max in flight {d['max_in_flight'] or '-'}; "
        f"rate limit {rate}; disable after {d['disable_after'] or '-'}"
    )


def format_config(table: ConfigTable, *, show_secrets: bool = False, as_json: bool = False) -> str:
    """What ``config show`` prints: tables (a policy line under each destination), or JSON."""
    import orjson

    data: dict[str, list[dict[str, Any]]] = {
        "sources": [
            {
                "id": s.id,
                "name": s.name,
                "write_keys": [_mask(k, show_secrets) for k in s.write_keys],
                "blocked_events": s.blocked_events,
            }
            for s in sorted(table.sources.values(), key=lambda s: s.id)
        ],
        "destinations": [
            _destination_data(d, show_secrets)
            for d in sorted(table.destinations.values(), key=lambda d: d.id)
        ],
    }
    if as_json:
        return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()
    lines = [f"{'SOURCE':<20} {'NAME':<24} {'WRITE KEYS':<10} BLOCKED EVENTS"]
    for s in data["sources"]:
        lines.append(
            f"{s['id']:<20} {s['name']:<24} {len(s['write_keys']):<10} "
            f"{', '.join(s['blocked_events']) or '-'}"
        )
    lines.append("")
    lines.append(
        f"{'DESTINATION':<20} {'NAME':<12} {'ENABLED':<8} {'SOURCES':<16} {'SIGNED':<7} WEBHOOKS"
    )
    for d in data["destinations"]:
        urls = ", ".join(w["url"] for w in d["webhooks"])
        lines.append(
            f"{d['id']:<20} {d['name']:<12} {'yes' if d['enabled'] else 'no':<8} "
            f"{','.join(d['sources']):<16} {'yes' if d['shared_secret'] else 'no':<7} {urls}"
        )
        lines.append(f"  {_policy_line(d)}")
        if d["disabled_reason"] is not None:
            since = (
                "" if d["disabled_at"] is None else f" since {format_timestamp(d['disabled_at'])}"
            )
            lines.append(f"  disabled: {d['disabled_reason']}{since}")
    return "\n".join(lines)
