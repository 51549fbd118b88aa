"""The dashboard app under Starlette's TestClient, for the tests that read its pages."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from starlette.testclient import TestClient

from pgq_supervisor.jobs import stale_after
from pgq_supervisor.web import create_app


@contextlib.contextmanager
def dashboard_client(dsn: str, *, open_actions: bool = False) -> Iterator[TestClient]:
    """A client of create_app(dsn) (its actions open to unauthenticated posts with
    `open_actions`), the app's pool closed after it. Supervisor rows are judged as with a
    600 s heartbeat: a row a test wrote stays live however slowly the test runs (a row an hour
    old is still stale)."""
    app = create_app(
        dsn, allow_unauthenticated_actions=open_actions, stale_after=stale_after(600.0)
    )
    with TestClient(app) as c:
        yield c
    app.state.pgq_close()
