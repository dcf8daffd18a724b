"""The destinations: the overview (every destination at a glance, the worst first), their list,
a destination's settings page (new or changed, validated as ``config apply`` validates a file)
and its toggle.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from aiohttp import web

from pipeline.core.config import ConfigTable, Destination, PipelineConfig, validate_config
from pipeline.core.config_export import config_data
from pipeline.core.console import (
    Bar,
    FormError,
    bars,
    destination_data,
    destination_form,
    held_users_text,
    problems_by_field,
    webhook_rows,
)
from pipeline.core.destination_security import shown_proxy, tls_text
from pipeline.core.durations import HOUR_MS, parse_duration
from pipeline.core.exceptions import ConfigError
from pipeline.core.secret_rotation import keyed, new_secret, rotated
from pipeline.core.signing import public_key_of
from pipeline.core.timestamps import format_timestamp, now_ms
from pipeline.http.console._page import Views, local_path, redirect, session_of
from pipeline.runtime.client_tls import receiver_auth_problems
from pipeline.store import DestinationStats

__all__ = ["DestinationViews"]


@dataclass(frozen=True, slots=True)
class Tile:
    """One destination on the overview."""

    destination: Destination
    stats: DestinationStats | None
    circuit_open: bool
    dead_24h: int
    bars: list[Bar]

    @property
    def problem(self) -> int:
        """How much is wrong; the overview lists the worst first."""
        ratio = self.stats.success_ratio if self.stats else None
        return (
            (2 if self.circuit_open else 0)
            + (1 if ratio is not None and ratio < 0.99 else 0)
            + (1 if self.dead_24h else 0)
            + (1 if not self.destination.enabled else 0)
        )


class DestinationViews(Views):
    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/", self.overview)
        app.router.add_get("/destinations", self.destinations)
        app.router.add_get("/destinations/new", self.new_destination)
        app.router.add_post("/destinations/new", self.create_destination)
        app.router.add_get("/destinations/{id}", self.destination)
        app.router.add_post("/destinations/{id}", self.save_destination)
        app.router.add_post("/destinations/{id}/toggle", self.toggle_destination)
        app.router.add_post("/destinations/{id}/rotate-secret", self.rotate_secret)

    # ---- overview -------------------------------------------------------------------------------

    async def overview(self, request: web.Request) -> web.Response:
        now = now_ms()
        table = self.console.table
        since = now - HOUR_MS
        start_hour = now - now % HOUR_MS - 23 * HOUR_MS
        stats = await self.console.query(lambda store: store.stats(since)) or []
        hourly = await self.console.query(lambda store: store.hourly(start_hour)) or {}
        by_id = {s.destination: s for s in stats}
        tiles = []
        for dest in table.destinations.values():
            hours = hourly.get(dest.id, [])
            tiles.append(
                Tile(
                    dest,
                    by_id.get(dest.id),
                    self.console.events.circuits_open(dest.id),
                    sum(h.dead_lettered for h in hours),
                    bars([(h.hour, h.delivered, h.failed) for h in hours], start_hour),
                )
            )
        tiles.sort(key=lambda t: (-t.problem, t.destination.id))
        return self._page(request, "overview.html", tiles=tiles)

    # ---- destinations ---------------------------------------------------------------------------

    async def destinations(self, request: web.Request) -> web.Response:
        table = self.console.table
        return self._page(
            request,
            "destinations.html",
            destinations=sorted(table.destinations.values(), key=lambda d: d.id),
        )

    def _destination_or_404(self, request: web.Request) -> Destination:
        dest = self.console.table.destinations.get(request.match_info["id"])
        if dest is None:
            raise web.HTTPNotFound(text=f"no destination {request.match_info['id']!r}")
        return dest

    def _destination_form(
        self,
        request: web.Request,
        dest: Destination | None,
        *,
        form: dict[str, str] | None = None,
        checked_sources: list[str] | None = None,
        errors: dict[str, list[str]] | None = None,
        status: int = 400,
    ) -> web.Response:
        table = self.console.table
        rows = webhook_rows(dest)
        if form is None:
            form = {**destination_form(dest), "version": self._version_of(dest)}
            checked_sources = list(dest.sources) if dest else []
        else:  # the rows posted, however many (a form holds at most a few more than allowed)
            posted = [int(k[4:]) for k in form if re.fullmatch(r"url_\d{1,2}", k)]
            rows = max(rows, 1 + max(posted, default=0))
        events = self.console.events.of(f"destination:{dest.id}") if dest is not None else []
        origin = self.console.config.origin(f"destination:{dest.id}") if dest else None
        held = self.console.held
        held_line = (
            held_users_text(
                dest, held.of(dest.id) if held.ready else None, known=held.ready, now_ms=now_ms()
            )
            if dest is not None
            else None
        )
        pace_line = None
        if dest is not None:
            said = self.console.pace.of(dest.id).text(time.time())
            if said is not None:
                pace_line = f"Pace: {said}"
            elif dest.rate_limit is not None:
                pace_line = f"Pace: {dest.rate_limit:g}/s (its rate_limit, for all workers)"
        return self._page(
            request,
            "destination.html",
            status=status if errors else 200,
            dest=dest,
            form=form,
            rows=range(rows),
            sources=sorted(table.sources.values(), key=lambda s: s.id),
            checked_sources=checked_sources or [],
            errors=errors or {},
            events=events,
            origin=origin,
            held_line=held_line,
            pace_line=pace_line,
            # Windows still open (an ended one leaves the config at the deliver role's sweep).
            rotations=[p for p in dest.previous_secrets if p.until_ms > now_ms()] if dest else [],
            public_key=public_key_of(dest.signing_key) if dest and dest.signing_key else None,
            proxy=shown_proxy(dest.proxy) if dest and dest.proxy else None,
            tls=tls_text(dest.mtls) if dest and dest.mtls else None,
        )

    async def destination(self, request: web.Request) -> web.Response:
        return self._destination_form(request, self._destination_or_404(request))

    async def new_destination(self, request: web.Request) -> web.Response:
        return self._destination_form(request, None)

    async def save_destination(self, request: web.Request) -> web.Response:
        return await self._save_destination(request, self._destination_or_404(request))

    async def create_destination(self, request: web.Request) -> web.Response:
        return await self._save_destination(request, None)

    async def _save_destination(
        self, request: web.Request, current: Destination | None
    ) -> web.Response:
        posted = await request.post()
        form = {k: str(v) for k, v in posted.items() if k not in ("csrf", "source")}
        checked = [str(s) for s in posted.getall("source", [])]
        try:
            data = destination_data(form, checked, current)
        except FormError as exc:
            errors = {exc.field: [str(exc)]}
            return self._destination_form(
                request, current, form=form, checked_sources=checked, errors=errors
            )
        if current is None and data["id"] in self.console.table.destinations:
            errors = {"id": [f"id: a destination {data['id']!r} exists already"]}
            return self._destination_form(
                request, current, form=form, checked_sources=checked, errors=errors
            )
        try:
            dest = _validated_destination(
                self.console.table, data, self.console.settings.allowed_networks, current
            )
        except ConfigError as exc:
            errors = problems_by_field(exc.problems, str(data["id"]))
            return self._destination_form(
                request, current, form=form, checked_sources=checked, errors=errors
            )
        session = session_of(request)
        async with self.console.lock:
            live = self.console.table.destinations.get(str(data["id"]))
            if current is not None and form.get("version", "") != self._version_of(live):
                origin = self.console.config.origin(f"destination:{current.id}")
                who = f" by {origin.changed_by}" if origin and origin.changed_by else ""
                stale = {
                    "": [
                        f"this destination was changed{who} since this form was opened: "
                        "reload it to see the change (nothing was saved)"
                    ]
                }
                return self._destination_form(
                    request, live, form=form, checked_sources=checked, errors=stale, status=409
                )
            if live is not None:  # the pipeline's own marks stay unless the state changed
                dest = _keep_disable_marks(live, dest)
            dest = keyed(dest, live)  # Ed25519 asked for: the live key, or a new one
            changed = await self.console.save(dest, session.who)
        flash = f"saved: {', '.join(changed)}" if changed else "nothing changed"
        raise redirect(f"/destinations/{dest.id}", flash, session)

    def _version_of(self, dest: Destination | None) -> str:
        """What the form carries to tell whether the destination changed since it was opened:
        when its config record was last written."""
        if dest is None:
            return ""
        origin = self.console.config.origin(f"destination:{dest.id}")
        return str(origin.changed_at) if origin and origin.changed_at else ""

    async def toggle_destination(self, request: web.Request) -> web.Response:
        """Set the state the button asked for (not "the other one": a page open for a while
        must not undo a change made since, such as the pipeline's auto-disable)."""
        form = await request.post()
        wanted = form.get("enabled")
        if wanted not in ("0", "1"):
            raise web.HTTPBadRequest(text="enabled: must be 0 or 1")
        session = session_of(request)
        back = local_path(str(form.get("back", "/destinations")), "/destinations")
        async with self.console.lock:
            dest = self._destination_or_404(request)
            state = "enabled" if wanted == "1" else "disabled"
            if dest.enabled == (wanted == "1"):
                raise redirect(back, f"{dest.id} is {state} already", session)
            toggled = dest.model_copy(
                update={"enabled": wanted == "1", "disabled_reason": None, "disabled_at": None}
            )
            await self.console.save(toggled, session.who)
        raise redirect(back, f"{dest.id} {state}", session)

    async def rotate_secret(self, request: web.Request) -> web.Response:
        """A new random shared secret, the old one signing on for the window asked (as
        ``pipeline config rotate-secret``); the new secret is never shown."""
        form = await request.post()
        session = session_of(request)
        back = f"/destinations/{quote(request.match_info['id'])}"
        try:
            window = parse_duration(str(form.get("window", "24h")), name="window")
        except ValueError as exc:
            raise redirect(back, f"not rotated: {exc}", session) from None
        async with self.console.lock:
            dest = self._destination_or_404(request)
            now = time.time()
            try:
                turned = rotated(dest, new_secret(), window, now)
            except ValueError as exc:
                raise redirect(back, f"not rotated: {exc}", session) from None
            await self.console.save(turned, session.who)
        until = format_timestamp(int((now + window) * 1000))
        raise redirect(
            back,
            f"secret rotated: the previous one signs until {until}; read the new one with "
            "pipeline config show --show-secrets",
            session,
        )


def _validated_destination(
    table: ConfigTable,
    data: dict[str, Any],
    allowed_networks: Sequence[str],
    current: Destination | None,
) -> Destination:
    """The destination ``data`` describes, validated within the live config as ``config apply``
    would validate the file (``ConfigError`` with its words otherwise)."""
    whole = config_data(table)
    others = [d for d in whole["destinations"] if d["id"] != data["id"]]
    index = len(others)
    whole["destinations"] = [*others, data]
    config = validate_config(whole)
    dest: Destination = config.destinations[index]
    # TLS files and token URLs, checked here when they change (they are set in the config file:
    # an unchanged one was checked where it was applied, on a machine that has the files).
    unchanged = current is not None and (current.mtls, current.oauth2) == (dest.mtls, dest.oauth2)
    if not unchanged and (dest.mtls is not None or dest.oauth2 is not None):
        problems = receiver_auth_problems(PipelineConfig(destinations=[dest]), allowed_networks)
        if problems:
            raise ConfigError(
                [p.replace("destinations[0]", f"destinations[{index}]") for p in problems]
            )
    return dest


def _keep_disable_marks(current: Destination, new: Destination) -> Destination:
    if new.enabled == current.enabled and current.disabled_reason:
        return new.model_copy(
            update={"disabled_reason": current.disabled_reason, "disabled_at": current.disabled_at}
        )
    return new
