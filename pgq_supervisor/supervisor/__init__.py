"""The supervisor process: one selector loop (loop.py) over its children (children.py: spawn,
state, kill; what a death means: verdicts.py, written by deaths.py; cancels.py), its LISTEN
connection (listener.py),
its /metrics server (metrics.py) and its timers on the control connection (maintenance/). The
fork server its children are forked from imports preload.py. Nothing is imported here, so
the fork server and the children load only the modules they use."""
