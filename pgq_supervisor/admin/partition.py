"""`partition`: turns the job table into one partitioned by enqueue time (schema/0029,
docs/storage.md), whose finished jobs then leave by dropping whole partitions. Opt-in: run it
once, with the supervisors stopped; the supervisors find the table partitioned and keep its
partitions from then on. Registered by admin.add_commands."""

from __future__ import annotations

import argparse
from typing import TypeVar

import psycopg

from pgq_supervisor.connect import open_db
from pgq_supervisor.db import partitions as db_partitions
from pgq_supervisor.errors import DatabaseError
from pgq_supervisor.settings import Settings

Parser = TypeVar("Parser", bound=argparse.ArgumentParser)


def add_command(sub: argparse._SubParsersAction[Parser], parents: list[Parser]) -> None:
    p = sub.add_parser(
        "partition",
        parents=parents,
        help="partition the job table by enqueue time, for retention by dropping partitions"
        " (opt-in; stop the supervisors first; docs/storage.md)",
    )
    p.add_argument(
        "--lock-timeout",
        type=float,
        default=10.0,
        help="seconds to wait for the job table's lock (default: 10)",
    )
    p.set_defaults(handler=cmd_partition)


def cmd_partition(args: argparse.Namespace, settings: Settings) -> int:
    _, conn = open_db(settings)
    with conn:
        try:
            done = db_partitions.convert(
                conn,
                settings.db_schema,
                interval=settings.partition_interval,
                lock_timeout=args.lock_timeout,
            )
        except DatabaseError as exc:
            if not isinstance(exc.__cause__, psycopg.errors.LockNotAvailable):
                raise
            print(
                f"error: the job table stayed locked for {args.lock_timeout:g} s (stop the"
                " supervisors and producers, then run it again); nothing changed"
            )
            return 1
    if done:
        print(f"the job table is partitioned by enqueue time ({settings.partition_interval:g} s"
              " a partition): finished jobs now leave with their partition")  # fmt: skip
    else:
        print("the job table is partitioned already: nothing to do")
    return 0
