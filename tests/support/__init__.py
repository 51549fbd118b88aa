"""The helpers every kind of test shares, in one package:

- `waiting`: `wait_for(what, check)`, the one way a test waits on a condition (with a deadline).
- `specs`: `child_spec(dsn, ...)`, the one way a test builds a child's ChildSpec.
- `db`: rows, claims, listeners, thread fan-out, the database gate (integration tests).
- `processes`: the real CLI as a subprocess, `run_cli`, counts (process tests).
- `fakes`: fake time and fake process spawning for the supervisor's unit tests.
"""
