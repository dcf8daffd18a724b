"""``pipeline config apply FILE`` / ``show`` / ``export``: publish, print and save sources and
destinations.

``config apply`` is not the only writer of the config topic: the web console and the deliver
role's auto-disable change entities too. Before ``config apply`` updates or deletes an entity
someone else changed since the last apply, it names the change (who, when) and asks, or without a
terminal refuses unless ``--force``: the file is usually older than that change, and overwriting it
silently would undo, say, an operator's emergency toggle. ``config export`` writes the live config
as a file, so the way to keep such a change is to export, edit, and apply.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import yaml

from pipeline.commands._args import Subparsers
from pipeline.core.durations import format_duration
from pipeline.core.exceptions import ConfigError
from pipeline.core.settings import Settings
from pipeline.core.timestamps import format_timestamp, now_ms

if TYPE_CHECKING:  # pydantic loads only for the commands that need it
    from pipeline.core.config import ConfigTable, Destination
    from pipeline.kafka.config_store import Origin

__all__ = ["register", "run", "format_config", "format_export", "overwrite_warning"]


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
    apply.add_argument(
        "--force",
        action="store_true",
        help="overwrite changes made outside config apply (web console, auto-disable) without "
        "asking; without a terminal to ask, apply refuses to overwrite them unless given this",
    )
    show = actions.add_parser("show", parents=[common], help="print the live config")
    show.add_argument("--json", action="store_true", help="JSON output")
    show.add_argument("--show-secrets", action="store_true", help="print secrets unmasked")
    export = actions.add_parser(
        "export",
        parents=[common],
        help="print the live config as the YAML file config apply takes (secrets included)",
    )
    export.add_argument(
        "--output",
        "-o",
        metavar="FILE",
        help="write it to FILE, readable by its owner only (mode 0600), instead of stdout",
    )
    rotate = actions.add_parser(
        "rotate-secret",
        parents=[common],
        help="give a destination a new random shared secret, the old one signing on for a window",
    )
    rotate.add_argument("destination", help="the destination's id")
    rotate.add_argument(
        "--window",
        default="24h",
        help="how long the old secret still signs (1m..7d; default 24h): X-Signature keeps it "
        "until then, and Standard Webhooks signs with both",
    )
    parser.set_defaults(run=run, kafka="wait")


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "apply":
        return _apply(args, settings)
    if args.action == "export":
        return _export(args, settings)
    if args.action == "rotate-secret":
        return _rotate(args, settings)
    return _show(args, settings)


def _rotate(args: argparse.Namespace, settings: Settings) -> int:
    """A new secret for one destination, the old one kept until the window ends; the new secret
    is never printed (``config show --show-secrets`` or ``config export`` has it)."""
    from pipeline.core.durations import parse_duration
    from pipeline.core.secret_rotation import new_secret
    from pipeline.core.secret_rotation import rotated as rotate
    from pipeline.kafka.config_store import load_table, write_config

    try:
        window = parse_duration(args.window, name="--window")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    destination = load_table(settings).destinations.get(args.destination)
    if destination is None:
        print(f"error: no destination {args.destination!r}", file=sys.stderr)
        return 1
    now = time.time()
    try:
        rotated = rotate(destination, new_secret(), window, now)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    write_config(settings, [rotated], changed_by="rotate-secret")
    until = format_timestamp(int((now + window) * 1000))
    print(
        f"rotated the shared secret of {destination.id}: until {until} X-Signature is still made "
        "with the previous secret and webhook-signature (Standard Webhooks) carries a signature "
        "for each; from then on only the new one signs.\n"
        f"read the new secret with: pipeline config show --show-secrets --json"
    )
    return 0


def _read_yaml(path: str) -> object:
    text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()  # noqa: SIM115
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML: {exc}"]) from None


def _apply(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.core.config import validate_config
    from pipeline.kafka.config_store import plan_config, write_plan
    from pipeline.runtime.client_tls import receiver_auth_problems

    config = validate_config(_read_yaml(args.file))
    # The files it names, read here, and its token URLs, before anything is applied.
    problems = receiver_auth_problems(config, settings.allowed_networks)
    if problems:
        raise ConfigError(problems)
    for warning in _blocked_url_warnings(config, settings):
        print(f"warning: {warning}", file=sys.stderr)
    plan = plan_config(settings, config, prune=not args.no_prune)
    for key, origin in plan.overwrites.items():
        warning = overwrite_warning(key, origin, deleting=key in plan.deleted)
        print(f"warning: {warning}", file=sys.stderr)
    if not args.dry_run:
        if plan.overwrites and not args.force and not _confirm_overwrite(args.file == "-"):
            print(
                f"error: not applied, nothing was written: it would overwrite "
                f"{len(plan.overwrites)} change(s) made outside config apply. To keep them, "
                "put them in the file first ('pipeline config export' prints the live config); "
                "to overwrite them, run again with --force",
                file=sys.stderr,
            )
            return 1
        write_plan(settings, plan)
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


def overwrite_warning(key: str, origin: Origin, *, deleting: bool) -> str:
    """``destination:hooks was changed by console:ab12 at 2026-11-23T22:01:05Z since the last
    apply; applying overwrites that change``."""
    when = "" if origin.changed_at is None else f" at {_utc_seconds(origin.changed_at)}"
    effect = "applying deletes it" if deleting else "applying overwrites that change"
    return f"{key} was changed by {origin.changed_by}{when} since the last apply; {effect}"


def _utc_seconds(ms: int) -> str:
    """``2026-11-23T22:01:05Z``: when a person changed something, milliseconds are noise."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms // 1000))


def _confirm_overwrite(file_from_stdin: bool) -> bool:
    """Ask on the terminal whether to overwrite; with no terminal to ask (a script, CI, or the
    file itself piped in on stdin) the answer is no."""
    if file_from_stdin or not sys.stdin.isatty():
        return False
    print("overwrite? [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


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


def _mask_pem(value: str, show: bool) -> str:
    """A client key as ``config show`` prints it: its path, or its PEM text masked."""
    from pipeline.core.config import is_pem

    return value if show or not is_pem(value) else "•••• (PEM)"


def _show(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.kafka.config_store import load_config

    table, origins = load_config(settings)
    text = format_config(table, origins=origins, show_secrets=args.show_secrets, as_json=args.json)
    print(text)
    return 0


def _export(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.kafka.clients import topics_for
    from pipeline.kafka.config_store import load_table

    table = load_table(settings)
    text = format_export(
        table,
        exported_at=now_ms(),
        bootstrap_servers=settings.bootstrap_servers,
        topic=topics_for(settings).config,
    )
    if args.output is None:
        sys.stdout.write(text)
        return 0
    _write_private(args.output, text)
    print(
        f"wrote {len(table.sources)} sources and {len(table.destinations)} destinations to "
        f"{args.output} (mode 0600: it holds secrets)",
        file=sys.stderr,
    )
    return 0


def format_export(
    table: ConfigTable, *, exported_at: int, bootstrap_servers: str, topic: str
) -> str:
    """What ``config export`` writes: a comment saying when and from where, then the config file
    (``config_data``) as YAML, short lists and mappings inline as in the documented example."""
    from pipeline.core.config_export import config_data

    header = (
        f"# pipeline config export at {_utc_seconds(exported_at)} from topic {topic} "
        f"at {bootstrap_servers}; holds secrets\n"
    )
    body = yaml.dump(
        config_data(table),
        Dumper=_ExportDumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=None,
    )
    return header + body


class _ExportDumper(yaml.SafeDumper):
    """PyYAML's safe dumper, except that a string holding U+0085 (NEL) is double-quoted, where
    it is escaped: plain or single-quoted, PyYAML writes it raw and reads it back as a line
    break, so a name holding one would not survive the export."""


def _represent_text(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = '"' if "\x85" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_ExportDumper.add_representer(str, _represent_text)


def _write_private(path: str, text: str) -> None:
    """Write ``text`` to ``path``, readable and writable by its owner only: it holds secrets."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(descriptor, "w", encoding="utf-8") as out:
        os.fchmod(descriptor, 0o600)  # a file that existed keeps its old mode otherwise
        out.write(text)


def _durations(seconds: Sequence[float] | None) -> list[str] | None:
    return None if seconds is None else [format_duration(s) for s in seconds]


def _duration(seconds: float | None) -> str | None:
    return None if seconds is None else format_duration(seconds)


def _destination_data(d: Destination, show_secrets: bool) -> dict[str, Any]:
    """One destination with the config file's keys, durations as text (``10s``, ``4h``), and the
    public key of its signing key."""
    from pipeline.core.config_export import batch_data
    from pipeline.core.destination_security import shown_proxy
    from pipeline.core.signing import public_key_of

    return {
        "id": d.id,
        "name": d.name,
        "enabled": d.enabled,
        "sources": d.sources,
        "shared_secret": _mask(d.shared_secret, show_secrets),
        "previous_secrets": [
            {"secret": _mask(p.secret, show_secrets), "until": format_timestamp(p.until_ms)}
            for p in d.previous_secrets
        ],
        "standard_webhooks": d.standard_webhooks,
        "signing": None if d.signing is None else d.signing.value,
        "signing_key": _mask(d.signing_key, show_secrets),
        "signing_public_key": None if d.signing_key is None else public_key_of(d.signing_key),
        "proxy": d.proxy if d.proxy is None or show_secrets else shown_proxy(d.proxy),
        "oauth2": None
        if d.oauth2 is None
        else {
            "token_url": d.oauth2.token_url,
            "client_id": d.oauth2.client_id,
            "client_secret": _mask(d.oauth2.client_secret, show_secrets),
            "scope": d.oauth2.scope,
        },
        "mtls": None
        if d.mtls is None
        else {
            "certificate": d.mtls.certificate,
            "key": None if d.mtls.key is None else _mask_pem(d.mtls.key, show_secrets),
            "ca": d.mtls.ca,
        },
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
        "ordering": d.ordering.value,
        "batch": None if d.batch is None else batch_data(d.batch),
        "disabled_reason": d.disabled_reason,
        "disabled_at": d.disabled_at,
    }


def _policy_line(d: dict[str, Any]) -> str:
    """``retry 10s,1m,5m deadline 4h; max in flight 200; rate limit 50/s; disable after 24h``,
    then ``; ordering per_user`` when the ordering is not the default (``none``), and
    ``; batches of 100 / 500KB / 1s`` when calls go in batches."""
    from pipeline.core.config import Ordering

    retry = d["retry"] or {}
    delays = ",".join(retry.get("delays") or []) or "default"
    deadline = retry.get("deadline") or "default"
    rate = "-" if d["rate_limit"] is None else f"{d['rate_limit']:g}/s"
    ordering = "" if d["ordering"] == Ordering.NONE else f"; ordering {d['ordering']}"
    batch = d["batch"]
    batches = (
        ""
        if batch is None
        else f"; batches of {batch['max_events']} / {batch['max_bytes']} / {batch['max_wait']}"
    )
    return (
        f"retry {delays} deadline {deadline}; max in flight {d['max_in_flight'] or '-'}; "
        f"rate limit {rate}; disable after {d['disable_after'] or '-'}{ordering}{batches}"
    )


def _origin_data(origins: Mapping[str, Origin] | None, key: str) -> dict[str, Any]:
    """``changed_by`` and ``changed_at`` (epoch ms) of the entity ``key``, when origins are known."""
    if origins is None:
        return {}
    origin = origins.get(key)
    return {
        "changed_by": None if origin is None else origin.changed_by,
        "changed_at": None if origin is None else origin.changed_at,
    }


def _origin_line(entity: Mapping[str, Any]) -> list[str]:
    """``  changed by console:ab12 at 2026-11-23T22:01:05Z``, or nothing when unknown."""
    if entity.get("changed_by") is None:
        return []
    at = entity["changed_at"]
    return [
        f"  changed by {entity['changed_by']}" + ("" if at is None else f" at {_utc_seconds(at)}")
    ]


def format_config(
    table: ConfigTable,
    *,
    origins: Mapping[str, Origin] | None = None,
    show_secrets: bool = False,
    as_json: bool = False,
) -> str:
    """What ``config show`` prints: tables (a policy line under each destination), or JSON.

    With ``origins`` (``load_config``), who last changed each entity, and when, is shown too.
    """
    import orjson

    from pipeline.core.config import ClientTls
    from pipeline.core.destination_security import tls_text

    data: dict[str, list[dict[str, Any]]] = {
        "sources": [
            {
                "id": s.id,
                "name": s.name,
                "write_keys": [_mask(k, show_secrets) for k in s.write_keys],
                "blocked_events": s.blocked_events,
                **_origin_data(origins, f"source:{s.id}"),
            }
            for s in sorted(table.sources.values(), key=lambda s: s.id)
        ],
        "destinations": [
            {
                **_destination_data(d, show_secrets),
                **_origin_data(origins, f"destination:{d.id}"),
            }
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
        lines += _origin_line(s)
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
        if d["mtls"] is not None:
            lines.append(f"  tls: {tls_text(ClientTls(**d['mtls']))}")
        if d["oauth2"] is not None:
            oauth = d["oauth2"]
            scope = f", scope {oauth['scope']}" if oauth["scope"] else ""
            lines.append(f"  oauth2: client {oauth['client_id']} at {oauth['token_url']}{scope}")
        if d["proxy"] is not None:
            lines.append(f"  proxy: {d['proxy']}")
        if d["signing_public_key"] is not None:
            lines.append(f"  signing {d['signing']}: public key {d['signing_public_key']}")
        for previous in d["previous_secrets"]:
            lines.append(f"  rotating: the previous secret signs until {previous['until']}")
        if d["disabled_reason"] is not None:
            since = (
                "" if d["disabled_at"] is None else f" since {format_timestamp(d['disabled_at'])}"
            )
            lines.append(f"  disabled: {d['disabled_reason']}{since}")
        lines += _origin_line(d)
    return "\n".join(lines)
