"""What the supervisor's selector reports (loop.py registers each with one of these as its
data): a recorded signal, the LISTEN connection, a child's pipe, a child's exit sentinel."""

from __future__ import annotations

from dataclasses import dataclass

from pgq_supervisor.supervisor.children import Child


@dataclass(frozen=True, slots=True)
class SignalSource:
    """The signal wake-up fd: a handler recorded a signal."""


@dataclass(frozen=True, slots=True)
class ListenSource:
    """The LISTEN connection: notifications arrived, or it broke."""


@dataclass(frozen=True, slots=True)
class PipeSource:
    child: Child


@dataclass(frozen=True, slots=True)
class ExitSource:
    """The child's process sentinel: it exited."""

    child: Child


Source = SignalSource | ListenSource | PipeSource | ExitSource
