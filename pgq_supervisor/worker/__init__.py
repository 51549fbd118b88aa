"""A child worker process: claim, run, settle.

    supervisor ──pipe──▶ child (main thread)              child (pgq-heartbeat thread)
      Wake / Stop          Worker: claim ◀─ job conn         every heartbeat_interval:
      ◀── Ready / Idle     Executor: run handler, in order   UPDATE its own worker row
          Report           Completer: write outcomes         (every job it holds alive),
      ◀── shared slot ──   slot = job in hand, held count    on its own connection; and
                                                             a batch behind a long job
                                                             goes back (unstarted.py)

The Worker owns the job connection and the loop: claim a batch (sized from how long recent
jobs took, and never past max_jobs) → run it in order → settle (jobs not started go back) →
report; or, when a claim finds nothing, send Idle and block on the pipe. When one job of the
batch runs past `release_unstarted_after`, the heartbeat thread releases the jobs behind it and
writes the successes before it, so nothing waits on a slow job but that job.

A child opens its job and heartbeat connections together at boot, or exits as a boot failure
(the supervisor retries it with backoff); it claims only while its heartbeat is up, and when no
beat has reached the database for half of dead_after it asks the supervisor, through its slot,
to stop it and release its jobs without an attempt (docs/connections.md).

The Executor runs a handler; runs.py holds every way to run one (sync, in a thread, async, in
a `conn` transaction), each ending in a Settlement; Completer.settle writes it, fenced by the
lease: a failure at once, successes in the statement of the next claim (or a flush when a
batch runs long), and keeps every held job in the heartbeat until its outcome lands. A database
error backs off with jitter, reconnects if the connection is gone (waking for a Stop), then
lets the Completer write or forget its buffer. Pipe EOF (the supervisor is gone) makes the
child finish the job in hand and exit. SIGINT is ignored (Ctrl-C reaches the supervisor too,
and it stops the children). SIGTERM is a stop, as Stop is, and the child tells the supervisor it
leaves (Retiring): the handler only records it and wakes the loop (signals.ChildSignals), the
job in hand runs to its end. The supervisor's own SIGTERM (a timeout, a cancel) is a kill: it
marks the slot first, and the handler then dies of the signal at once.

Modules: main.py (child_main: boot, then one of the two workers), base.py (BaseWorker: what
both loops share, and what they run jobs with), sync.py (Worker, one job at a time),
inflight.py (InFlightWorker, many jobs in flight) and admission.py (what it may claim and
start), executor.py, completion.py, heartbeat.py, runs.py, progress.py. ChildSpec is in ipc.py.
"""
