"""The dashboard: an ASGI app (Starlette, Jinja2) over the queue's tables; optional extra `web`.

    from pgq_supervisor.web import basic_auth, create_app
    app = create_app("postgresql://...", authorize=basic_auth("oncall", secret))
    # or a psycopg_pool.ConnectionPool; without authorize it is read-only

Mount it under any path of an ASGI application (FastAPI, Starlette, Django's ASGI), or run it
alone with `python -m pgq_supervisor dashboard`. See app.py for the pages, the actions and how
they are protected.
"""

from pgq_supervisor.web.app import ACTIONS, Authorize, create_app
from pgq_supervisor.web.auth import basic_auth

__all__ = ["ACTIONS", "Authorize", "basic_auth", "create_app"]
