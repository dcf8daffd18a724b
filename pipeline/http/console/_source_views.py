"""The sources: their list (write keys masked), a source's schema page (the track events seen
lately) with a write key revealed on request, and blocking or unblocking an event.
"""

from __future__ import annotations

from aiohttp import web

from pipeline.core.config import Source
from pipeline.core.console import mask_key
from pipeline.core.durations import HOUR_MS
from pipeline.core.timestamps import now_ms
from pipeline.http.console._page import Views, redirect, session_of

__all__ = ["SourceViews"]

#: The source schema page lists the track events seen this long (seed §4.3 rule 7).
SCHEMA_WINDOW_MS = 7 * 24 * HOUR_MS


class SourceViews(Views):
    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/sources", self.sources)
        app.router.add_get("/sources/{id}", self.source)
        app.router.add_post("/sources/{id}/reveal", self.reveal_key)
        app.router.add_post("/sources/{id}/events", self.block_event)

    async def sources(self, request: web.Request) -> web.Response:
        table = self.console.table
        return self._page(
            request,
            "sources.html",
            sources=sorted(table.sources.values(), key=lambda s: s.id),
            mask_key=mask_key,
            destinations_of=lambda s: [
                d.id for d in table.destinations.values() if s.id in d.sources
            ],
        )

    def _source_or_404(self, request: web.Request) -> Source:
        source = self.console.table.sources.get(request.match_info["id"])
        if source is None:
            raise web.HTTPNotFound(text=f"no source {request.match_info['id']!r}")
        return source

    async def source(self, request: web.Request, revealed: int | None = None) -> web.Response:
        source = self._source_or_404(request)
        since = now_ms() - SCHEMA_WINDOW_MS
        names = await self.console.query(lambda store: store.event_names(source.id, since))
        seen = {n.name for n in names or []}
        blocked_unseen = [name for name in source.blocked_events if name not in seen]
        return self._page(
            request,
            "source.html",
            source=source,
            names=names or [],
            blocked=set(source.blocked_events),
            blocked_unseen=blocked_unseen,
            revealed=revealed,
            mask_key=mask_key,
            events=self.console.events.of(f"source:{source.id}"),
            origin=self.console.config.origin(f"source:{source.id}"),
        )

    async def reveal_key(self, request: web.Request) -> web.Response:
        source = self._source_or_404(request)
        form = await request.post()
        try:
            index = int(str(form.get("key", "")))
            source.write_keys[index]
        except (ValueError, IndexError):
            raise web.HTTPBadRequest(text="key: no such write key") from None
        return await self.source(request, revealed=index)

    async def block_event(self, request: web.Request) -> web.Response:
        form = await request.post()
        name = str(form.get("event", ""))
        action = form.get("action")
        if not name or action not in ("block", "unblock"):
            raise web.HTTPBadRequest(text="event and action (block or unblock) are required")
        session = session_of(request)
        async with self.console.lock:  # read, change and write with no other save between
            source = self._source_or_404(request)
            blocked = [n for n in source.blocked_events if n != name]
            if action == "block":
                blocked.append(name)
            updated = source.model_copy(update={"blocked_events": blocked})
            await self.console.save(updated, session.who)
        raise redirect(f"/sources/{source.id}", f"{name!r} {action}ed", session)
