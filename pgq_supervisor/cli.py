"""The command line: the only module that wires settings, database, app and supervisor together.

Exit codes: 0 ok, 1 failure, 2 bad usage or configuration, 3 the app failed to load. Every
error is one line on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, NoReturn

from setproctitle import getproctitle

from pgq_supervisor import admin, db
from pgq_supervisor import schema as migrations
from pgq_supervisor.cli_help import (
    RUN_FLAGS as RUN_FLAGS,  # the flags of `run` (the Django command reuses them)
)
from pgq_supervisor.cli_help import (
    HelpFormatter,
    command_helps,
    grouped_commands,
    setting_help,
)
from pgq_supervisor.connect import open_db, resolve_dsn
from pgq_supervisor.errors import (
    AppLoadError,
    ConfigError,
    ExitCode,
    InvalidInput,
    MigrationLocked,
    PgqError,
    install_hint,
)
from pgq_supervisor.inputs import not_utf8
from pgq_supervisor.jobs import NewJob, stale_after
from pgq_supervisor.jsontext import MAX_PAYLOAD_ENV, load_json_object
from pgq_supervisor.logs import setup_logging
from pgq_supervisor.redaction import hide_password, title_without_secrets
from pgq_supervisor.registry import Registry, load_registry
from pgq_supervisor.settings import Settings, load_settings, parse_duration

if TYPE_CHECKING:
    from pgq_supervisor.web import Authorize  # the web extra is optional: imported when used

log = logging.getLogger("pgq_supervisor")

COMMANDS = ("run", "migrate", "enqueue", "demo", "dashboard", "embedded", *admin.COMMANDS)


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.USAGE, f"error: {message} (see --help)\n")


Handler = Callable[[argparse.Namespace, Settings], int]


def build_parser() -> argparse.ArgumentParser:
    common = OneLineParser(add_help=False)
    common.add_argument("--dsn", help="PostgreSQL DSN (env PGQ_DSN); unset = embedded server")
    common.add_argument("--schema", dest="db_schema", help="schema name (env PGQ_SCHEMA)"
                        " (default: pgq)")  # fmt: skip
    common.add_argument("--log-level", help=setting_help("log_level"))
    common.add_argument("--log-format", help=setting_help("log_format"))

    parser = OneLineParser(
        prog="pgq-supervisor",
        usage="%(prog)s [COMMAND] [FLAGS]",
        description="PostgreSQL job queue with process workers. Default command: run (flags"
        " alone run it).\nEvery setting also reads PGQ_<SETTING> from the environment or .env.",
        formatter_class=HelpFormatter,
    )
    sub = parser.add_subparsers(
        dest="command",
        parser_class=OneLineParser,
        prog="pgq-supervisor",
        metavar="COMMAND",
        help=argparse.SUPPRESS,
    )
    run = sub.add_parser("run", parents=[common], usage="%(prog)s [FLAGS]",
                         help="run the supervisor and its workers")  # fmt: skip
    for flag, name in RUN_FLAGS.items():
        run.add_argument(flag, dest=name, metavar=name.upper(), help=setting_help(name))
    run.set_defaults(handler=cmd_run)

    mig = sub.add_parser("migrate", parents=[common], help="create or upgrade the schema")
    lock_help = Settings.model_fields["migrate_lock_timeout"].description
    mig.add_argument("--lock-timeout", dest="migrate_lock_timeout", metavar="SEC", help=lock_help)
    mig.set_defaults(handler=cmd_migrate)

    enq = sub.add_parser("enqueue", parents=[common], help="enqueue one job")
    enq.add_argument("type", help="the job type")
    enq.add_argument("payload", help="JSON object")
    enq.add_argument("--priority", type=int, default=0, help="higher runs first")
    enq.add_argument("--start-in", help="delay, e.g. 30s, 5m, 2h, 1d")
    enq.add_argument(
        "--unique-key", help="unique among unfinished jobs: the holder's id is printed"
    )
    enq.add_argument("--concurrency-key", help="the key of the type's key_concurrency limit")
    enq.add_argument(
        "--tenant", help="the job's tenant: the type's claims go round-robin across tenants"
    )
    enq.add_argument(
        "--max-retry-count", type=int, help="retries after the first attempt; unset = the handler's"
    )
    cap = Settings.model_fields["max_payload_bytes"].description
    enq.add_argument("--max-payload-bytes", metavar="MAX_PAYLOAD_BYTES", help=cap)
    enq.set_defaults(handler=cmd_enqueue)

    emb = sub.add_parser(
        "embedded",
        parents=[common],
        help="the embedded server: print its DSN (starting it, kept running), or stop it",
    )
    emb.add_argument("action", nargs="?", choices=("dsn", "stop"), default="dsn",
                     help="dsn (the default) or stop")  # fmt: skip
    emb.set_defaults(handler=cmd_embedded)

    demo = sub.add_parser("demo", parents=[common], help="run sample jobs through a supervisor")
    demo.add_argument("--jobs", type=int, default=300, help="sample jobs")
    demo.add_argument("--procs", type=int, default=None, help="child processes (default: CPUs)")
    demo.add_argument(
        "--yes", action="store_true", help="write into the database PGQ_DSN/--dsn names unasked"
    )
    demo.set_defaults(handler=cmd_demo)

    dash = sub.add_parser(
        "dashboard", parents=[common], help="serve the web dashboard (extra: web)"
    )
    dash.add_argument("--host", default="127.0.0.1", help="address to listen on")
    dash.add_argument("--port", type=int, default=8080, help="port")
    dash.add_argument("--read-only", action="store_true", help="show no action, refuse all")
    dash.add_argument(
        "--allow-unauthenticated-actions",
        action="store_true",
        help="let anyone who can reach it act (retry, cancel, delete, pause); without it,"
        " actions need PGQ_DASHBOARD_USER and PGQ_DASHBOARD_PASSWORD (HTTP Basic)",
    )
    dash.set_defaults(handler=cmd_dashboard)

    admin.add_commands(sub, common)
    parser.epilog = grouped_commands(command_helps(sub))
    for command in sub.choices.values():
        command.formatter_class = HelpFormatter
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if bad := not_utf8(args_list):
        return _fail(ExitCode.USAGE, bad, ())
    # Before anything can touch os.environ (the app's imports included): setproctitle needs
    # the process's original argv/environ block, which a changed variable moves out of.
    with contextlib.suppress(UnicodeDecodeError):  # a non-UTF-8 byte in the environment
        getproctitle()
    if not args_list or (args_list[0] not in COMMANDS and args_list[0] not in ("-h", "--help")):
        if args_list and not args_list[0].startswith("-"):
            # `run` (the default) takes no positional argument: a word here is a command
            return _fail(ExitCode.USAGE, _unknown_command(args_list[0]), args_list[:1])
        args_list.insert(0, "run")
    parser = build_parser()
    args = parser.parse_args(args_list)
    given = vars(args)
    dashboard = f"http://{args.host}:{args.port}/" if args.command == "dashboard" else None
    title_without_secrets(args_list, given.get("dsn"), given.get("listen_dsn"), dashboard)
    flags = {
        k: v
        for k, v in given.items()
        if k in Settings.model_fields or k == "db_schema"
        if args.command == "run" or k in Settings.EVERY_COMMAND
    }
    # every DSN the command may have been given, whose password no error line may show
    dsns = [flags.get("dsn"), flags.get("listen_dsn")]
    dsns += [os.environ.get("PGQ_DSN"), os.environ.get("PGQ_LISTEN_DSN")]
    try:
        settings = load_settings(**flags)
        dsns += [settings.dsn, settings.listen_dsn]
        # the library (and every child of `run`) reads the cap from the environment
        os.environ[MAX_PAYLOAD_ENV] = str(settings.max_payload_bytes)
        setup_logging(settings.log_level, settings.log_format, (settings.dsn, settings.listen_dsn))
        handler: Handler = args.handler
        return handler(args, settings)
    except (ConfigError, InvalidInput, MigrationLocked) as exc:
        return _fail(ExitCode.USAGE, str(exc), dsns)
    except AppLoadError as exc:
        # the whole traceback at --log-level debug, before the one line said either way
        log.debug("the app failed to load", exc_info=exc.__cause__ or exc)
        return _fail(ExitCode.APP_LOAD, str(exc), dsns)
    except PgqError as exc:
        return _fail(ExitCode.FAILURE, str(exc), dsns)
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED


def _unknown_command(word: str) -> str:
    close = difflib.get_close_matches(word, COMMANDS, n=1)
    if close:
        return f"unknown command {word!r}, did you mean {close[0]}? (see --help)"
    return f"unknown command {word!r} (commands: {', '.join(COMMANDS)}; see --help)"


def _fail(code: ExitCode, message: str, dsns: Sequence[object]) -> int:
    line = message.splitlines()[0] if message else "failed"
    line = hide_password(line, *(d for d in dsns if isinstance(d, str)))
    print(f"error: {line}", file=sys.stderr)
    return int(code)


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    from pgq_supervisor.supervisor.loop import Supervisor
    from pgq_supervisor.supervisor.metrics import Metrics, MetricsServer

    if not settings.app:
        raise ConfigError("no app given: pass --app package.module:registry or set PGQ_APP")
    registry = load_registry(settings.app)
    unknown = sorted(set(settings.types or ()) - set(registry.types))
    if unknown:
        raise ConfigError(f"invalid setting types: no handler for {', '.join(unknown)}")
    dsn, conn = open_db(settings, wait=True)
    with conn:
        # before any child claims: rates and limits are enforced from the rows written here
        served = settings.types or registry.types
        rates = registry.rates(served)
        db.sync_rates(
            conn,
            settings.db_schema,
            served,
            {t: (r.max_starts, r.period) for t, r in rates.items()},
        )
        limits = registry.limits(served)
        db.sync_limits(
            conn,
            settings.db_schema,
            served,
            {t: (lim.global_, lim.per_key) for t, lim in limits.items()},
        )
        settings = _fit_connection_budget(conn, settings, registry)
    metrics = Metrics()
    sup = Supervisor(settings, registry, dsn, metrics=metrics)
    server = None
    if settings.metrics_port is not None:
        try:
            server = MetricsServer(
                metrics, settings.metrics_host, settings.metrics_port, sup.healthy, sup.ready
            )
        except OSError as exc:
            raise ConfigError(
                f"invalid setting metrics_port: cannot listen on"
                f" {settings.metrics_host}:{settings.metrics_port}: {exc.strerror}"
            ) from exc
        server.start()
    try:
        return sup.run()
    finally:
        if server is not None:
            server.stop()


def _fit_connection_budget(conn: db.Conn, settings: Settings, registry: Registry) -> Settings:
    """The settings with as many procs as the database's connections allow (budget.py), read
    on the start-up connection, before any child exists."""
    from pgq_supervisor.supervisor import budget

    if settings.connection_budget == "off":
        return settings
    types = settings.types or registry.types
    need = budget.need(
        registry, types, settings.procs, settings.concurrency, settings.child_pool_size
    )
    limits = db.connection_limits(conn, settings.db_schema)
    room = budget.room(limits, settings.connection_headroom)
    fitted = budget.fit(need, room, settings.connection_budget)
    if fitted.warning is not None:
        log.warning("%s", fitted.warning)
    return settings.model_copy(update={"procs": fitted.procs, "child_pool_size": fitted.pool_size})


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    dsn, _embedded = resolve_dsn(settings)
    with db.connect_at_startup(
        dsn, settings.connect_timeout, prepare_threshold=settings.prepare_threshold
    ) as conn:
        done = migrations.migrate(
            conn, settings.db_schema, lock_timeout=settings.migrate_lock_timeout
        )
    if done:
        what = "migration" if len(done) == 1 else "migrations"
        print(f"applied {what} {', '.join(map(str, done))} to schema {settings.db_schema}")
    else:
        print(f"schema {settings.db_schema} is up to date")
    return 0


def cmd_enqueue(args: argparse.Namespace, settings: Settings) -> int:
    payload = load_json_object(args.payload, "payload")
    delay = parse_duration(args.start_in) if args.start_in else None
    _, conn = open_db(settings)
    with conn:
        start_at = None
        if delay is not None:
            # eligibility is judged by the database clock, so the delay counts from it
            start_at = db.db_now(conn, settings.db_schema) + timedelta(seconds=delay)
        job = NewJob(
            type=args.type,
            payload=payload,
            priority=args.priority,
            start_at=start_at,
            unique_key=args.unique_key,
            concurrency_key=args.concurrency_key,
            tenant=args.tenant,
            max_retry_count=args.max_retry_count,
            origin="cli",
        )
        job_id = db.enqueue(conn, settings.db_schema, job)
    print(job_id)
    return 0


def cmd_embedded(args: argparse.Namespace, settings: Settings) -> int:
    from pgq_supervisor.embedded import project_data_dir, start_embedded, stop_embedded

    data_dir = project_data_dir()
    if args.action == "stop":
        print(f"stopped the embedded server in {data_dir}" if stop_embedded(data_dir)
              else f"no embedded server is running in {data_dir}")  # fmt: skip
        return 0
    dsn = start_embedded(data_dir, keep_running=True)
    with db.connect_at_startup(dsn, settings.connect_timeout) as conn:
        migrations.migrate(conn, settings.db_schema, lock_timeout=settings.migrate_lock_timeout)
    print(dsn)  # alone on stdout: PGQ_DSN=$(python -m pgq_supervisor embedded)
    log.info("the embedded server in %s keeps running: `embedded stop` stops it", data_dir)
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from pgq_supervisor.demo import cmd_demo as demo

    return demo(args, settings)


def _dashboard_auth(settings: Settings) -> Authorize | None:
    """HTTP Basic from PGQ_DASHBOARD_USER and PGQ_DASHBOARD_PASSWORD (both, or neither)."""
    from pgq_supervisor.web import basic_auth

    user = settings.dashboard_user
    password = settings.dashboard_password.get_secret_value() if settings.dashboard_password else ""
    if not user and not password:
        return None
    if not user or not password:
        missing = "dashboard_password" if user else "dashboard_user"
        raise ConfigError(
            f"invalid setting {missing}: PGQ_DASHBOARD_USER and PGQ_DASHBOARD_PASSWORD go"
            " together (HTTP Basic for the dashboard's pages and actions)"
        )
    return basic_auth(user, password)


def cmd_dashboard(args: argparse.Namespace, settings: Settings) -> int:
    """Serve pgq_supervisor.web on host:port until SIGINT/SIGTERM (uvicorn's handling), then
    exit 0."""
    import signal
    import socket

    try:
        import uvicorn

        from pgq_supervisor.web import create_app
        from pgq_supervisor.web.access import RequestLog
    except ImportError as exc:
        raise ConfigError(
            f"the dashboard needs the web extra ({install_hint('web')}): {exc}"
        ) from None
    if not 0 < args.port < 65536:
        raise ConfigError(f"invalid port {args.port}: must be 1 to 65535")
    try:  # one clear line now rather than uvicorn's log and exit later
        with socket.create_server((args.host, args.port)):
            pass
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ConfigError(f"cannot listen on {args.host}:{args.port}: {why}") from None
    authorize = _dashboard_auth(settings)
    dsn, conn = open_db(settings, wait=True)  # reachable and migrated, else one line and exit
    conn.close()
    app = create_app(
        dsn,
        authorize=authorize,
        read_only=args.read_only,
        allow_unauthenticated_actions=args.allow_unauthenticated_actions,
        schema=settings.db_schema,
        stale_after=stale_after(settings.heartbeat_interval),
        secret=settings.dashboard_secret.get_secret_value() if settings.dashboard_secret else None,
    )
    if args.read_only:
        how = "read-only"
    elif authorize is not None:
        how = f"HTTP Basic, user {settings.dashboard_user}"
    elif args.allow_unauthenticated_actions:
        how = "actions open to anyone"
    else:
        how = (
            "read-only: set PGQ_DASHBOARD_USER and PGQ_DASHBOARD_PASSWORD, or pass"
            " --allow-unauthenticated-actions, to act"
        )
    print(f"dashboard on http://{args.host}:{args.port}/ ({how})", flush=True)
    # uvicorn stops on SIGTERM/SIGINT, then raises the signal again under the handler it found:
    # the default one would kill the process (exit 143) after a clean stop. A stop is no failure.
    stops = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        uvicorn.run(
            RequestLog(app),
            host=args.host,
            port=args.port,
            log_level="warning",
            log_config=None,  # our handlers and format (text or json), not uvicorn's
            access_log=False,  # RequestLog logs each request at DEBUG instead of INFO
        )
    finally:
        for sig, previous in stops.items():
            signal.signal(sig, previous)
        app.state.pgq_close()
    return 0
