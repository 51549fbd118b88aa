"""`manage.py pgq_worker`: `pgq-supervisor run` with the flags of `run`, serving the queues of
the TASKS backends that are ours (and the handlers of `--app`, if given)."""

from __future__ import annotations

import os
import sys
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from psycopg.conninfo import make_conninfo

from pgq_supervisor import cli
from pgq_supervisor.contrib.django.backend import (
    USER_APP_ENV,
    WORKER_APP,
    backend_options,
    options_database,
    options_schema,
)

# what of Django's connection parameters is a libpq connection string's (the rest, such as
# its cursor_factory, is Django's)
_LIBPQ = (
    "dbname", "user", "password", "host", "port", "sslmode", "sslrootcert", "sslcert",
    "sslkey", "options", "application_name", "connect_timeout", "service", "passfile",
    "target_session_attrs",
)  # fmt: skip


def django_dsn(alias: str) -> str:
    """A libpq connection string for Django's database `alias`."""
    params = connections[alias].get_connection_params()
    return make_conninfo(**{k: str(v) for k, v in params.items() if k in _LIBPQ and v != ""})


class Command(BaseCommand):
    help = (
        "Run pgq_supervisor's supervisor and workers for the Django tasks (the flags of"
        " `pgq-supervisor run`; the DSN is Django's database unless --dsn or PGQ_DSN says)."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--dsn", help="PostgreSQL DSN (default: the backend's database)")
        parser.add_argument("--schema", dest="db_schema", help="schema name (env PGQ_SCHEMA)")
        parser.add_argument("--log-level", help="debug | info | warning | error")
        parser.add_argument("--log-format", help="text | json")
        for flag, name in cli.RUN_FLAGS.items():
            parser.add_argument(flag, dest=name, metavar=name.upper())

    def handle(self, *args: Any, **options: Any) -> None:
        found = backend_options()
        places = {(options_database(p), options_schema(p)) for _, p in found}
        if len(places) > 1:  # one supervisor serves one database and schema
            raise CommandError(
                "pgq_worker serves one queue: TASKS has pgq backends in different databases or"
                f" schemas ({', '.join(f'{d}/{s}' for d, s in sorted(places))}); give them one"
                " DATABASE and SCHEMA"
            )
        params = found[0][1] if found else {}
        if options["dsn"] is None and not os.environ.get("PGQ_DSN"):
            # the environment, not argv: a password in argv shows in `ps`
            os.environ["PGQ_DSN"] = django_dsn(options_database(params))
        schema = options["db_schema"] or os.environ.get("PGQ_SCHEMA") or options_schema(params)
        os.environ["PGQ_SCHEMA"] = schema  # the children's tasks read it (takes_context)
        # the user's own handlers (--app, else PGQ_APP) beside the tasks: our app is the one run
        if user_app := options["app"] or os.environ.get("PGQ_APP"):
            os.environ[USER_APP_ENV] = user_app
        argv = ["run", "--app", WORKER_APP, "--schema", schema]
        for flag, name in [("--dsn", "dsn"), ("--log-level", "log_level"),
                           ("--log-format", "log_format"), *cli.RUN_FLAGS.items()]:  # fmt: skip
            if name != "app" and options.get(name) is not None:
                argv += [flag, str(options[name])]
        code = cli.main(argv)
        if code:
            sys.exit(code)
