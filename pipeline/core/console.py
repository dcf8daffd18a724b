"""The console's pure logic: a destination form to the config file's mapping, validation errors
next to their fields, what a change changed, masked write keys, and the 24-hour chart's bars.

The console validates a form exactly as ``config apply`` validates a file: the form becomes the
file's mapping for one destination (``destination_data``), the live config with that entry in
place is validated (``pipeline.core.config.validate_config``), and each problem, worded as
``config apply`` words it, is shown next to the field it names (``problems_by_field``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.core.config import (
    ConfigTable,
    Destination,
    Ordering,
    Signing,
    Source,
)
from pipeline.core.config_export import batch_data, config_data
from pipeline.core.durations import HOUR_MS
from pipeline.core.held_users import HeldUsers

__all__ = [
    "Bar",
    "FormError",
    "bars",
    "changed_fields",
    "destination_data",
    "destination_form",
    "held_users_text",
    "mask_key",
    "problems_by_field",
    "webhook_rows",
]

#: The form offers the webhooks a destination has and one empty row, so that one more can be typed
#: (a sixth is refused with the same words as ``config apply``).
_SPARE_ROWS = 1


class FormError(ValueError):
    """A form field that cannot even be read as the file's value; ``field`` names it as the
    config file would (``webhooks[1].headers``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def webhook_rows(destination: Destination | None) -> int:
    """How many webhook rows the destination form shows."""
    return (len(destination.webhooks) if destination is not None else 0) + _SPARE_ROWS


def _headers(text: str, field: str) -> dict[str, str]:
    """``Name: value`` lines to a mapping; blank lines are skipped."""
    headers: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, colon, value = line.partition(":")
        if not colon or not name.strip():
            raise FormError(field, f"line {number} {line!r} is not 'Name: value'")
        # "Name: value": the one space after the colon is the form's; the rest is the value's.
        headers[name.strip()] = value[1:] if value.startswith(" ") else value
    return headers


def _number(text: str, *, whole: bool) -> Any:
    """The number typed, or the text itself so that the model's error names it."""
    text = text.strip()
    try:
        return int(text) if whole else float(text)
    except ValueError:
        return text


def destination_data(
    form: Mapping[str, str],
    sources: Sequence[str],
    current: Destination | None,
) -> dict[str, Any]:
    """The config file's mapping for the destination the form describes.

    ``form`` holds ``id`` (a new destination only), ``name``, ``enabled`` (``on`` when ticked),
    ``url_N`` / ``headers_N`` per webhook row, ``secret_action`` (``keep``, ``set``, ``clear``)
    with ``secret``, and the policy: ``retry_delays`` (``10s, 1m``), ``retry_deadline``,
    ``max_in_flight``, ``rate_limit``, ``disable_after``; an empty policy field means the global
    setting; ``ordering`` (``none``, ``per_user``; left out: the current one's); ``signing``
    (``none``, ``ed25519``; left out: the current one's; the key is never in a form); ``batch``
    (``on``, ``off``; left out: the current batch) with ``batch_max_events``,
    ``batch_max_bytes`` and ``batch_max_wait`` (empty: the batch's default).
    ``sources`` are the ticked source ids. Rows without a URL are left out (that is how a
    webhook is removed). ``FormError`` for a value that is not even the file's kind of value.
    """
    data: dict[str, Any] = {
        "id": current.id if current is not None else form.get("id", "").strip(),
        "name": form.get("name", ""),
        "enabled": form.get("enabled") == "on",
        "sources": list(sources),
    }
    webhooks: list[dict[str, Any]] = []
    rows = sorted(int(name[4:]) for name in form if re.fullmatch(r"url_\d{1,3}", name))
    for row in rows:
        url = form.get(f"url_{row}", "").strip()
        if not url:
            continue
        field = f"webhooks[{len(webhooks)}].headers"
        webhooks.append({"url": url, "headers": _headers(form.get(f"headers_{row}", ""), field)})
    data["webhooks"] = webhooks

    action = form.get("secret_action", "keep")
    if action == "set":
        secret = form.get("secret", "")
        if not secret:
            raise FormError("shared_secret", "type the new secret, or keep the current one")
        data["shared_secret"] = secret
    elif action == "keep" and current is not None and current.shared_secret:
        data["shared_secret"] = current.shared_secret
    elif action not in ("keep", "clear"):
        raise FormError("shared_secret", f"unknown action {action!r}")
    # What the form does not edit stays as the file says it: the settings made in the config
    # file (TLS files, the proxy, OAuth2), and a rotation's windows while a secret is kept (the
    # rotate button starts one; clearing the secret ends them).
    if current is not None:
        exported = config_data(ConfigTable.build((), (current,)))["destinations"][0]
        kept = [*_FILE_ONLY, *(["previous_secrets"] if "shared_secret" in data else [])]
        data.update({key: exported[key] for key in kept if key in exported})
    if current is not None and current.standard_webhooks and "shared_secret" in data:
        data["standard_webhooks"] = True

    retry: dict[str, Any] = {}
    if delays := form.get("retry_delays", "").strip():
        retry["delays"] = [d.strip() for d in delays.split(",")]
    if deadline := form.get("retry_deadline", "").strip():
        retry["deadline"] = deadline
    if retry:
        data["retry"] = retry
    if max_in_flight := form.get("max_in_flight", "").strip():
        data["max_in_flight"] = _number(max_in_flight, whole=True)
    if rate_limit := form.get("rate_limit", "").strip():
        data["rate_limit"] = _number(rate_limit, whole=False)
    if disable_after := form.get("disable_after", "").strip():
        data["disable_after"] = disable_after
    # A form without the field (a page or a script from before it) keeps the current ordering.
    ordering = form.get("ordering", current.ordering.value if current is not None else "").strip()
    if ordering and ordering != Ordering.NONE:
        data["ordering"] = ordering
    signing = form.get("signing", current.signing or "none" if current is not None else "none")
    if signing == Signing.ED25519:
        data["signing"] = signing
        if current is not None and current.signing_key:  # the key stays: its receivers have it
            data["signing_key"] = current.signing_key
    elif signing != "none":
        raise FormError("signing", f"must be none or ed25519, got {signing!r}")
    batch = _batch_data(form, current)
    if batch is not None:
        data["batch"] = batch
    return data


#: A destination's fields set in the config file only: the console keeps them (and shows the
#: TLS, proxy and OAuth2 ones).
_FILE_ONLY = ("mtls", "proxy", "oauth2", "trace_context")


def _batch_data(form: Mapping[str, str], current: Destination | None) -> dict[str, Any] | None:
    """The ``batch`` of the form (``None``: one call a request)."""
    if "batch" not in form:  # a page or a script from before it: the current batch stays
        return None if current is None or current.batch is None else batch_data(current.batch)
    choice = form["batch"].strip()
    if choice == "off":
        return None
    if choice != "on":
        raise FormError("batch", f"must be on or off, got {choice!r}")
    batch: dict[str, Any] = {}
    if max_events := form.get("batch_max_events", "").strip():
        batch["max_events"] = _number(max_events, whole=True)
    if max_bytes := form.get("batch_max_bytes", "").strip():
        batch["max_bytes"] = max_bytes
    if max_wait := form.get("batch_max_wait", "").strip():
        batch["max_wait"] = max_wait
    return batch


def destination_form(dest: Destination | None) -> dict[str, str]:
    """The form's fields for ``dest`` (a new destination's defaults for ``None``): the inverse of
    ``destination_data``. The secret is never among them; durations are written as the config
    file writes them (``10s``, ``4h``)."""
    if dest is None:
        return {"enabled": "on", "name": "Webhooks"}
    exported: dict[str, Any] = config_data(ConfigTable.build((), (dest,)))["destinations"][0]
    retry = exported.get("retry") or {}
    form = {
        "name": dest.name,
        "enabled": "on" if dest.enabled else "",
        "retry_delays": ", ".join(str(delay) for delay in retry.get("delays") or []),
        "retry_deadline": str(retry.get("deadline") or ""),
        "max_in_flight": "" if dest.max_in_flight is None else str(dest.max_in_flight),
        "rate_limit": "" if dest.rate_limit is None else _number_text(dest.rate_limit),
        "disable_after": str(exported.get("disable_after") or ""),
        "ordering": dest.ordering.value,
        "signing": "none" if dest.signing is None else dest.signing.value,
        "batch": "off" if dest.batch is None else "on",
    }
    if dest.batch is not None:
        written = batch_data(dest.batch)
        form["batch_max_events"] = str(written["max_events"])
        form["batch_max_bytes"] = str(written["max_bytes"])
        form["batch_max_wait"] = str(written["max_wait"])
    for row, hook in enumerate(dest.webhooks):
        form[f"url_{row}"] = hook.url
        form[f"headers_{row}"] = "\n".join(f"{k}: {v}" for k, v in hook.headers.items())
    return form


def _number_text(value: float) -> str:
    """``50`` for 50.0, else the shortest text that reads back as ``value``."""
    return str(int(value)) if value.is_integer() else repr(value)


_LOCATION = re.compile(
    r"^destinations\[\d+\](?: \((?P<id>[^)]*)\))?(?:\.(?P<field>[^:]+))?: (?P<text>.*)$"
)


def problems_by_field(problems: Sequence[str], destination_id: str) -> dict[str, list[str]]:
    """``config apply``'s problems about one destination, by the field they name.

    ``destinations[2] (hooks).webhooks[1].url: 'x' has no host`` goes under
    ``webhooks[1].url`` and keeps its whole wording; a problem naming no field, or another
    entity, goes under ``""`` (shown at the top of the form).
    """
    found: dict[str, list[str]] = {}
    for problem in problems:
        match = _LOCATION.match(problem)
        field = ""
        if match is not None and match.group("id") == destination_id:
            field = match.group("field") or ""
        found.setdefault(field, []).append(problem)
    return found


def changed_fields(old: Destination | Source | None, new: Destination | Source) -> list[str]:
    """The names of the fields ``new`` changes (all of them for a new entity). A secret's value
    is never named, only that it changed."""
    if old is None:
        return ["created"]
    before, after = old.model_dump(), new.model_dump()
    return [name for name in after if before.get(name) != after[name]]


def mask_key(key: str) -> str:
    """A write key as a page shows it until it is revealed: enough to tell keys apart.

    >>> mask_key("wk_live_1234567890")
    'wk_l••••••••90'
    >>> mask_key("short")
    '••••••••'
    """
    if len(key) < 10:
        return "•" * 8
    return f"{key[:4]}{'•' * 8}{key[-2:]}"


@dataclass(frozen=True, slots=True)
class Bar:
    """One hour of a destination's chart, in the SVG's units (height 0..``height``)."""

    x: int
    delivered: float
    failed: float
    title: str


def bars(
    hours: Sequence[tuple[int, int, int]], start_hour: int, count: int = 24, height: int = 30
) -> list[Bar]:
    """The chart of ``count`` hours from ``start_hour`` (epoch ms): per hour, bars of deliveries
    and failures scaled to the busiest hour; ``hours`` holds (hour, delivered, failed) for the
    hours that had any.

    >>> [(b.x, b.delivered, b.failed) for b in bars([(0, 10, 5)], 0, count=2)]
    [(0, 20.0, 10.0), (1, 0.0, 0.0)]
    """
    per_hour = {hour: (delivered, failed) for hour, delivered, failed in hours}
    busiest = max((d + f for d, f in per_hour.values()), default=0) or 1
    found = []
    for index in range(count):
        hour = start_hour + index * HOUR_MS
        delivered, failed = per_hour.get(hour, (0, 0))
        found.append(
            Bar(
                index,
                delivered * height / busiest,
                failed * height / busiest,
                f"{delivered} delivered, {failed} failed",
            )
        )
    return found


def held_users_text(
    destination: Destination, held: HeldUsers | None, *, known: bool, now_ms: int
) -> str | None:
    """The destination page's line about held users: for an ordered destination, or one that
    still has users held (it was ordered); ``None``: no line.

    >>> from pipeline.core.config import Ordering, Webhook
    >>> hook = Webhook(url="https://x.example")
    >>> ordered = Destination(
    ...     id="d", sources=["s"], ordering=Ordering.PER_USER, webhooks=[hook]
    ... )
    >>> held_users_text(ordered, None, known=True, now_ms=0)
    'Held users: 0'
    >>> held_users_text(ordered, HeldUsers(2, 1_000, "u", "m"), known=True, now_ms=301_000)
    'Held users: 2 (oldest since 1970-01-01T00:00:01Z, 5m ago)'
    """
    if held is not None:
        return f"Held users: {held.count:,} (oldest since {held.since_text(now_ms)})"
    if not destination.ordered:
        return None
    if not known:
        return "Held users: unknown (the ordering changelog is not read yet)"
    return "Held users: 0"
