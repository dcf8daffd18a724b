"""Deletion requests through the ingestion API's admin endpoint (seed §1.6)."""

from __future__ import annotations

import httpx

from pipeline.http.ingest import IngestOptions
from tests.support import BODY, stays, three_sources, wait_for

TOKEN = "admin-token-for-tests"


def test_admin_endpoint_notifies_each_affected_source_once(
    settings,
    receiver_factory,
    worker_factory,
    ingest_factory,
):
    receivers = [receiver_factory(), receiver_factory(), receiver_factory()]
    three_sources(settings, receivers)
    worker_factory(settings)
    api = ingest_factory(settings, IngestOptions(admin_token=TOKEN))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    url = f"{api.url}/admin/delete-user"

    unauthorized = {
        "success": False,
        "code": "unauthorized",
        "message": "Authorization: Bearer <PIPELINE_ADMIN_TOKEN> is required",
        "field": "Authorization",
    }
    anonymous = httpx.post(url, json={"userId": "user-42"})
    assert (anonymous.status_code, anonymous.json()) == (401, unauthorized)
    wrong = httpx.post(url, json={"userId": "user-42"}, headers={"Authorization": "Bearer no"})
    assert (wrong.status_code, wrong.json()) == (401, unauthorized)
    bad = httpx.post(url, json={"userId": 42}, headers=auth)
    assert (bad.status_code, bad.json()) == (
        400,
        {
            "success": False,
            "code": "invalid_field",
            "message": "userId: a string is required",
            "field": "userId",
        },
    )
    assert bad.headers["Content-Type"] == "application/json"

    first = httpx.post(url, json={"userId": "user-42", "reason": "GDPR"}, headers=auth, timeout=30)
    assert first.status_code == 200, first.text
    assert first.json()["notified"] == ["ios", "web"]
    assert first.json()["unaffected"] == ["batch"]
    web, ios, batch = receivers
    wait_for(lambda: web.count() == 1 and ios.count() == 1)
    assert all(BODY.fullmatch(r.requests[0].body) for r in (web, ios))

    again = httpx.post(url, json={"userId": "user-42"}, headers=auth, timeout=30)
    assert again.json()["notified"] == [] and again.json()["alreadyNotified"] == ["ios", "web"]
    assert stays(lambda: (web.count(), ios.count(), batch.count()) == (1, 1, 0), 1.5)

    status = httpx.get(f"{url}/user-42", headers=auth, timeout=30)
    assert status.status_code == 200
    assert [r["reason"] for r in status.json()["requests"]][:1] == ["GDPR"]
    # The answer is the record as its schema names it (camelCase), whatever Python calls it.
    shown = status.json()
    assert set(shown) == {"success", "userId", "requests"} and shown["userId"] == "user-42"
    assert [set(r) for r in shown["requests"]] == [
        {"requestedAt", "reason", "forced", "notifications"}
    ] * 2
    notes = shown["requests"][0]["notifications"]
    assert sorted(n["sourceId"] for n in notes) == ["ios", "web"]
    assert all(set(n) == {"sourceId", "messageId", "timestamp", "acknowledged"} for n in notes)
    assert all(n["acknowledged"] is True for n in notes)
    nobody = httpx.get(f"{url}/nobody", headers=auth, timeout=30)
    assert (nobody.status_code, nobody.json()) == (
        404,
        {"success": False, "code": "not_found", "message": "no deletion request for this user"},
    )


def test_admin_endpoints_are_off_without_a_token(settings, ingest_factory):
    api = ingest_factory(settings, IngestOptions())
    response = httpx.post(f"{api.url}/admin/delete-user", json={"userId": "u"}, timeout=10)
    assert (response.status_code, response.json()) == (
        404,
        {
            "success": False,
            "code": "admin_disabled",
            "message": "admin endpoints are off; set PIPELINE_ADMIN_TOKEN to turn them on",
        },
    )
