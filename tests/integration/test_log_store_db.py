"""The log store on a real PostgreSQL server (``postgres_url``: a fresh database per test): the
contract SQLite passes too, and what is PostgreSQL's own (an unreachable server, several
processes creating one schema, the dialect's bulk paths at scale)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

pytest.register_assert_rewrite("tests.log_store_contract")  # before it is imported

from pipeline.runtime.net import free_port  # noqa: E402
from pipeline.store import StoreUnavailable, open_store  # noqa: E402
from tests.log_store_contract import T0, Feed, LogStoreContract, attempt, routed  # noqa: E402


class TestPostgresStore(LogStoreContract):
    @pytest.fixture
    def store_url(self, postgres_url: str) -> str:
        return postgres_url


def test_an_unreachable_server_is_unavailable_with_the_password_masked():
    url = f"postgresql://app:s3cret@127.0.0.1:{free_port()}/log?connect_timeout=2"
    with pytest.raises(StoreUnavailable) as raised:
        open_store(url)
    message = str(raised.value)
    assert "s3cret" not in message
    assert message.startswith(f"log store postgresql://app:***@127.0.0.1:{url.split(':')[3]}")
    assert raised.value.url == url.replace("s3cret", "***")


def test_a_missing_database_is_unavailable(postgres_server: Any):
    with pytest.raises(StoreUnavailable, match='database "nope" does not exist'):
        open_store(postgres_server.url("nope"))


def test_a_lost_connection_is_unavailable_then_opened_again(postgres_url: str):
    import psycopg

    feed = Feed()
    with open_store(postgres_url) as store:
        store.write(feed(routed("m1", ("crm",), T0)))
        backend = store._db._connection.info.backend_pid  # type: ignore[attr-defined]
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
        rows = feed(attempt("m1", "crm", T0 + 1000))
        with pytest.raises(StoreUnavailable, match="log store postgresql://"):
            store.write(rows)
        assert store.write(rows) == 2  # the caller tries again: a new connection
        trace = store.trace("m1")
        assert trace is not None and trace.destinations[0].state.value == "delivered"


def test_processes_opening_a_new_store_together_agree_on_its_id(postgres_url: str):
    ids: list[str] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            with open_store(postgres_url) as store:
                ids.append(store.store_id)
        except BaseException as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(ids) == 4 and len(set(ids)) == 1
