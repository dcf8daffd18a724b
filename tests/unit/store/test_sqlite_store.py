"""The log store on SQLite (a file in the test's temp directory): the shared contract, and what is
SQLite's own: URLs and files, pragmas, several connections on one file, refusals."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.log_store_contract")  # before it is imported

from pipeline.store import (  # noqa: E402
    SCHEMA_VERSION,
    LogQuery,
    StoreError,
    StoreUnavailable,
    masked_url,
    open_store,
)
from pipeline.store import _sqlite as sqlite_backend  # noqa: E402
from tests.log_store_contract import T0, Feed, LogStoreContract, attempt, routed  # noqa: E402


class TestSqliteStore(LogStoreContract):
    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path}/log.sqlite3"  # an absolute path: four slashes


# ---- URLs and files -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["sqlite:///{tmp}/a/b/log.sqlite3", "{tmp}/a/b/log.sqlite3"],
    ids=["sqlite URL", "bare path"],
)
def test_a_file_and_its_directories_are_created(tmp_path: Path, url: str):
    store = open_store(url.format(tmp=tmp_path))
    store.close()
    assert (tmp_path / "a" / "b" / "log.sqlite3").is_file()


def test_three_slashes_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    with open_store("sqlite:///rel/log.sqlite3") as store:
        assert store.url == "sqlite:///rel/log.sqlite3"
        assert store.backend == "sqlite"
    assert (tmp_path / "rel" / "log.sqlite3").is_file()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://u:secret@db/log", "unknown scheme 'mysql'; accepted: sqlite://, postgresql://"),
        ("http://example.com/log", "unknown scheme 'http'"),
        ("sqlite://relative.db", "a SQLite URL is sqlite:///PATH"),
        ("sqlite:///", "a SQLite URL is sqlite:///PATH"),
        ("", "log store URL is empty"),
    ],
)
def test_a_url_of_another_kind_is_refused(url: str, message: str):
    with pytest.raises(ValueError, match=message) as raised:
        open_store(url)
    assert "secret" not in str(raised.value)


def test_the_password_is_masked():
    assert masked_url("postgresql://app:s3cret@db:5432/log") == "postgresql://app:***@db:5432/log"
    assert masked_url("postgres://db/log?password=s3cret&sslmode=require") == (
        "postgres://db/log?password=%2A%2A%2A&sslmode=require"
    )
    assert masked_url("postgresql://app@db/log") == "postgresql://app@db/log"
    assert masked_url("/var/lib/log.sqlite3") == "/var/lib/log.sqlite3"


def test_without_psycopg_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg → ImportError
    monkeypatch.delitem(sys.modules, "pipeline.store._postgres", raising=False)
    with pytest.raises(
        StoreError, match=r"pip install 'kafka-webhook-pipeline\[postgres\]'"
    ) as raised:
        open_store("postgresql://app:s3cret@db/log")
    assert "s3cret" not in str(raised.value) and "app:***@db" in str(raised.value)


def test_a_directory_that_cannot_be_made_is_unavailable(tmp_path: Path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StoreUnavailable, match="log store sqlite:///.*/file/log.sqlite3"):
        open_store(f"{tmp_path}/file/log.sqlite3")


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path):
    path = tmp_path / "log.sqlite3"
    path.write_bytes(b"this is not SQLite" * 100)
    with pytest.raises(StoreError, match="not a database"):
        open_store(str(path))


def test_a_store_from_a_newer_version_is_refused(tmp_path: Path):
    path = tmp_path / "log.sqlite3"
    open_store(str(path)).close()
    with sqlite3.connect(path) as db:
        db.execute(
            "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),)
        )
    db.close()
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}; this version"):
        open_store(str(path))


def test_a_bad_log_query_names_the_field():
    with pytest.raises(ValueError, match="state: 'lost' is not one of routed, delivered"):
        LogQuery(state="lost")
    with pytest.raises(ValueError, match="limit: must be 1 to 10,000, got 0"):
        LogQuery(limit=0)


# ---- SQLite's own -------------------------------------------------------------------------------


def test_wal_mode_and_the_schema_version_are_on_file(tmp_path: Path):
    path = tmp_path / "log.sqlite3"
    with open_store(str(path)) as store:
        store_id = store.store_id
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        assert meta == {"schema_version": str(SCHEMA_VERSION), "store_id": store_id}
    finally:
        db.close()


def test_bulk_statements_fit_an_older_sqlites_parameter_limit(tmp_path: Path):
    # SQLite before 3.32 allows 999 parameters a statement: the multi-row INSERTs and upserts
    # take fewer rows each, and every row still lands.
    with open_store(f"sqlite:///{tmp_path}/log.sqlite3") as store:
        connection = store._db._connection  # type: ignore[attr-defined]
        connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
        feed = Feed()
        assert store.write(feed(*(routed(f"m{i}", ("crm",), T0 + i) for i in range(300)))) == 600
        attempts = feed(*(attempt(f"m{i}", "crm", T0 + 10_000 + i) for i in range(300)))
        assert store.write(attempts) == 600
        journeys = store.log(LogQuery(limit=1000))
        assert len(journeys) == 300 and {j.state.value for j in journeys} == {"delivered"}


def test_a_nan_is_stored_as_null():
    # The bulk statements bind NaN for None (it binds ten times faster): SQLite must keep
    # storing it as NULL, which a NOT NULL column refuses like NULL itself.
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (a INTEGER, b TEXT, c INTEGER NOT NULL)")
    db.execute("INSERT INTO t VALUES (?, ?, 1)", (sqlite_backend._NULL, sqlite_backend._NULL))
    assert db.execute("SELECT typeof(a), typeof(b) FROM t").fetchall() == [("null", "null")]
    with pytest.raises(sqlite3.IntegrityError, match="NOT NULL"):
        db.execute("INSERT INTO t VALUES (1, 'x', ?)", (sqlite_backend._NULL,))


def test_unset_fields_are_null_in_every_table(tmp_path: Path):
    path = tmp_path / "log.sqlite3"
    with open_store(str(path)) as store:
        feed = Feed()
        store.write(feed(routed("m1", ("crm",), T0)))
        store.write(feed(attempt("m1", "crm", T0 + 1000)))
    db = sqlite3.connect(path)
    try:
        # received and routed have no destination, status, error, ok or duration
        entries = db.execute(
            "SELECT kind, typeof(destination), typeof(status), typeof(error), typeof(ok),"
            " typeof(duration_ms) FROM entries WHERE kind IN ('received', 'routed')"
        ).fetchall()
        assert sorted(entries) == [
            ("received", "null", "null", "null", "null", "null"),
            ("routed", "null", "null", "null", "null", "null"),
        ]
        (journey,) = db.execute(
            "SELECT typeof(anonymous_id), typeof(last_error), typeof(reason), typeof(tier),"
            " typeof(not_before), typeof(replay_id), typeof(last_status) FROM journeys"
        ).fetchall()
        assert journey == ("null",) * 6 + ("integer",)
        assert db.execute("SELECT typeof(anonymous_id) FROM calls").fetchall() == [("null",)]
        # and none of it is a float, anywhere
        for table, columns in (("entries", "status, ok, duration_ms"), ("journeys", "tier")):
            floats = db.execute(
                f"SELECT count(*) FROM {table} WHERE 'real' IN"  # noqa: S608
                f" ({', '.join(f'typeof({c})' for c in columns.split(', '))})"
            ).fetchone()
            assert floats == (0,)
    finally:
        db.close()


def test_a_reader_sees_the_writers_commits_while_it_writes(tmp_path: Path):
    url = f"sqlite:///{tmp_path}/log.sqlite3"
    with open_store(url) as writer, open_store(url) as reader:
        feed = Feed()
        writer.write(feed(routed("m1", ("crm",), T0)))
        assert reader.trace("m1") is not None
        writer.write(feed(attempt("m1", "crm", T0 + 1000)))
        trace = reader.trace("m1")
        assert trace is not None and trace.destinations[0].state.value == "delivered"


def test_opening_and_reading_never_wait_for_a_writer(tmp_path: Path):
    """A reader process (``pipeline trace``) opens the store while the writer holds its lock."""
    path = tmp_path / "log.sqlite3"
    with open_store(str(path)) as writer:
        writer.write(Feed()(routed("m1", ("crm",), T0)))
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # the writer, mid-transaction
        holder.execute("DELETE FROM positions")
        with open_store(str(path)) as reader:
            trace = reader.trace("m1")
            assert trace is not None and trace.destinations[0].state.value == "routed"
            assert reader.positions() == {0: 1}  # the committed state, not the writer's
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_lock_held_too_long_is_unavailable_then_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(sqlite_backend, "BUSY_TIMEOUT", 0.2)
    path = tmp_path / "log.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None)
    with open_store(str(path)) as store:
        holder.execute("BEGIN IMMEDIATE")  # another writer that does not let go
        try:
            with pytest.raises(StoreUnavailable, match="database is locked"):
                store.write(Feed()(routed("m1", ("crm",), T0)))
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert store.write(Feed()(routed("m1", ("crm",), T0))) == 2  # the caller tries again
