"""Errors of the delivery log's store, each mapping onto one decision of the caller.

    PipelineError                  (pipeline.core.exceptions)
    └── StoreError                 the store cannot be used as it is: a schema written by a newer
        │                          version of the pipeline (upgrade this one), a file that is not
        │                          a SQLite database, psycopg not installed for a PostgreSQL URL
        └── StoreUnavailable       the database cannot be reached or opened now (server down,
                                   wrong host or password, unwritable directory): fix the URL or
                                   the server, then start again

A URL the store does not understand is a ``ValueError`` (a configuration mistake, found before any
connection is tried). Messages name the store by its URL with the password masked (``masked_url``).
"""

from __future__ import annotations

from pipeline.core.exceptions import StoreError, StoreUnavailable

__all__ = ["StoreError", "StoreUnavailable"]
