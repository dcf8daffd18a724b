"""The messages: finding them and reading one's trace, the dead letters and their replay (a dry
run counts them first, then a job replays them), and a test event sent to a destination.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any
from urllib.parse import quote

import orjson
from aiohttp import web
from multidict import MultiMapping

from pipeline.core.calls import CallType, new_message_id, parse_call
from pipeline.core.exceptions import InvalidCall
from pipeline.core.render import render_body
from pipeline.core.timestamps import now_ms, parse_when
from pipeline.http.console._page import Views, redirect, session_of
from pipeline.ops.dlq import DlqFilter, list_dead_letters
from pipeline.store import LOG_STATES, LogQuery, trace_link

__all__ = ["MessageViews"]

#: What the test-event form starts with, per call type.
SAMPLES: dict[str, dict[str, Any]] = {
    "identify": {"userId": "test-user", "traits": {"email": "test@example.com"}},
    "track": {"userId": "test-user", "event": "Test Event", "properties": {"plan": "pro"}},
    "page": {"userId": "test-user", "name": "Home", "properties": {"path": "/"}},
    "screen": {"userId": "test-user", "name": "Dashboard"},
    "group": {"userId": "test-user", "groupId": "test-group", "traits": {"name": "Acme"}},
    "alias": {"userId": "test-user", "previousId": "anonymous-1"},
    "delete": {"userId": "test-user"},
}


class MessageViews(Views):
    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/messages", self.messages)
        app.router.add_get("/messages/{message_id:.+}", self.trace)  # an id may hold "/"
        app.router.add_get("/dead-letters", self.dead_letters)
        app.router.add_post("/dead-letters/replay", self.replay_dead_letters)
        app.router.add_get("/dead-letters/jobs/{id}", self.replay_job)
        app.router.add_get("/test-event", self.test_event)
        app.router.add_post("/test-event", self.send_test_event)

    # ---- messages -------------------------------------------------------------------------------

    async def messages(self, request: web.Request) -> web.Response:
        q = request.query
        message_id = q.get("message_id", "").strip()
        if message_id:
            raise web.HTTPSeeOther(f"/messages/{quote(message_id, safe='')}")
        error = None
        journeys = None
        if any(q.get(k) for k in ("user", "destination", "state", "since", "source", "type")):
            try:
                query = LogQuery(
                    destination=q.get("destination") or None,
                    source=q.get("source") or None,
                    user=q.get("user") or None,
                    call_type=q.get("type") or None,
                    state=q.get("state") or None,
                    since_ms=parse_when(q["since"], name="since") if q.get("since") else None,
                    until_ms=parse_when(q["until"], name="until") if q.get("until") else None,
                    limit=100,
                )
            except ValueError as exc:
                error = str(exc)
            else:
                journeys = await self.console.query(lambda store: store.log(query))
        return self._page(
            request,
            "messages.html",
            q=q,
            error=error,
            journeys=journeys,
            states=LOG_STATES,
            types=[t.value for t in CallType],
            destinations=sorted(self.console.table.destinations),
        )

    async def trace(self, request: web.Request) -> web.Response:
        message_id = request.match_info["message_id"]
        found = await self.console.query(lambda store: store.trace(message_id))
        template = self.console.settings.trace_url_template
        link = None
        if found is not None and found.trace_id is not None and template:
            link = trace_link(template, found.trace_id)
        return self._page(
            request,
            "trace.html",
            status=200 if found else 404,
            trace=found,
            message_id=message_id,
            trace_link=link,
        )

    # ---- dead letters ---------------------------------------------------------------------------

    @staticmethod
    def _dlq_filter(values: MultiMapping[Any]) -> DlqFilter:
        """The dead letters a page's filter (or a replay form) selects. ``since`` is a duration
        ago or a time; the confirmation form carries it as ``since_ms``, fixed at the dry run.
        A replay form's ticked ``id``s count unless ``scope`` is ``all``."""
        ids = [str(i) for i in values.getall("id", [])]
        if values.get("scope") == "selected" and not ids:
            raise ValueError("id: tick the dead letters to replay, or replay all that match")
        since = until = None
        if values.get("since_ms"):
            since = int(str(values["since_ms"]))
        elif values.get("since"):
            since = parse_when(str(values["since"]), name="since")
        if values.get("until_ms"):
            until = int(str(values["until_ms"]))
        return DlqFilter(
            destination=str(values.get("destination") or "") or None,
            reason=str(values.get("reason") or "") or None,
            since=since,
            until=until,
            ids=frozenset(ids) if ids and values.get("scope") != "all" else None,
        )

    async def dead_letters(self, request: web.Request) -> web.Response:
        q = request.query
        error = None
        entries = []
        try:
            selection = self._dlq_filter(q)
        except ValueError as exc:
            error = str(exc)
        else:
            entries = await asyncio.to_thread(list_dead_letters, self.console.settings, selection)
        return self._page(
            request,
            "dead_letters.html",
            q=q,
            error=error,
            entries=list(reversed(entries))[:500],
            total=len(entries),
            pending=sum(1 for e in entries if e.replayed_at is None and e.replayable),
            destinations=sorted(self.console.table.destinations),
            count=None,
        )

    async def replay_dead_letters(self, request: web.Request) -> web.Response:
        form = await request.post()
        try:
            selection = self._dlq_filter(form)
        except ValueError as exc:
            raise web.HTTPBadRequest(text=str(exc)) from None
        if selection.until is None:  # the dry run counts up to now; the replay takes that range
            selection = replace(selection, until=now_ms())
        entries = await asyncio.to_thread(list_dead_letters, self.console.settings, selection)
        pending = [e for e in entries if e.replayed_at is None and e.replayable]
        if form.get("action") != "replay":  # the dry run: count first
            return self._page(
                request,
                "replay_confirm.html",
                selection=selection,
                matching=len(entries),
                pending=len(pending),
                already=sum(1 for e in entries if e.replayed_at is not None),
            )
        session = session_of(request)
        if not pending:
            raise redirect(
                "/dead-letters", "nothing to replay: every match was replayed before", session
            )
        job = self.console.start_replay(selection, session.who)
        raise web.HTTPSeeOther(f"/dead-letters/jobs/{job.id}")

    async def replay_job(self, request: web.Request) -> web.Response:
        job = self.console.jobs.get(request.match_info["id"])
        if job is None:
            raise web.HTTPNotFound(text="no such replay (jobs are kept until the console restarts)")
        return self._page(request, "replay_job.html", job=job)

    # ---- test events ----------------------------------------------------------------------------

    async def test_event(self, request: web.Request) -> web.Response:
        call_type = request.query.get("type", "track")
        if call_type not in SAMPLES:
            call_type = "track"
        return self._test_page(
            request,
            destination=request.query.get("destination", ""),
            call_type=call_type,
            text=orjson.dumps(SAMPLES[call_type], option=orjson.OPT_INDENT_2).decode(),
        )

    def _test_page(
        self, request: web.Request, status: int = 200, /, **context: Any
    ) -> web.Response:
        return self._page(
            request,
            "test_event.html",
            status=status,
            destinations=sorted(self.console.table.destinations),
            types=list(SAMPLES),
            **{"error": None, "result": None, **context},
        )

    async def send_test_event(self, request: web.Request) -> web.Response:
        form = await request.post()
        dest_id = str(form.get("destination", ""))
        call_type = str(form.get("type", "track"))
        text = str(form.get("call", ""))
        again = {"destination": dest_id, "call_type": call_type, "text": text}
        dest = self.console.table.destinations.get(dest_id)
        if dest is None:
            return self._test_page(
                request, 400, error=f"destination: no destination {dest_id!r}", **again
            )
        if call_type not in SAMPLES:
            return self._test_page(
                request, 400, error=f"type: {call_type!r} is not a call type", **again
            )
        try:
            raw = orjson.loads(text)
            if isinstance(raw, dict):
                raw.setdefault("messageId", f"test-{new_message_id()}")
            call = parse_call(
                raw, source_id=dest.sources[0], received_at=now_ms(), call_type=call_type
            )
        except orjson.JSONDecodeError as exc:
            return self._test_page(request, 400, error=f"call: not JSON ({exc})", **again)
        except InvalidCall as exc:
            return self._test_page(request, 400, error=str(exc), **again)
        body = render_body(call)
        started = time.monotonic()
        signed, probes = await self.console.send_test(dest, body, call.message_id)
        return self._test_page(
            request,
            result={
                "body": body.decode(),
                "headers": signed,
                "probes": probes,
                "seconds": time.monotonic() - started,
                "message_id": call.message_id,
            },
            **again,
        )
