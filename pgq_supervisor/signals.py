"""Signal handlers that only record: the loop of the supervisor, or of a child, acts on what
they recorded.

Python runs a handler between bytecodes of the main thread, so a handler that reaped, spawned
or logged could interleave with the loop doing the same. These append the signal number to a
list and let `signal.set_wakeup_fd` write a byte to a socket the loop waits on.

A child's SIGTERM (ChildSignals) is a stop, as if the supervisor had sent Stop: systemd's
KillMode=control-group, `timeout(1)` and `kill -- -PGID` signal the whole group, supervisor and
children at once, and an operator may signal one child. The child's loop finishes the job in
hand, releases the rest, tells the supervisor it is leaving (Retiring) and exits 0; the handler
never raises into the job's code. The supervisor's own SIGTERM to a child (a timeout, a cancel:
supervisor/children.Child.terminate) is a kill, told apart by the mark it sets in the child's
shared slot first (a handler cannot see who sent a signal): then the handler restores the
default action and raises the signal again, so the child dies of SIGTERM at once, as it always
did. A handler runs only between bytecodes: a job stuck inside C code delays it, and the
supervisor's SIGKILL follows after KILL_GRACE as before.
"""

from __future__ import annotations

import signal
import socket

from pgq_supervisor.ipc import JobSlot

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGTTIN, signal.SIGTTOU)


class RecordedSignals:
    def __init__(self, handled: tuple[signal.Signals, ...] = HANDLED) -> None:
        self.handled = handled
        self._pending: list[int] = []
        self._wakeup: tuple[socket.socket, socket.socket] | None = None

    def install(self) -> socket.socket:
        """Record `handled` from now on (main thread only). Returns the socket to wait on."""
        self._wakeup = reader, writer = socket.socketpair()
        for sock in self._wakeup:
            sock.setblocking(False)
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        for sig in self.handled:
            signal.signal(sig, self._record)
        return reader

    def _record(self, signum: int, frame: object) -> None:
        self._pending.append(signum)

    def drain(self) -> None:
        """Empty the wake-up socket (the signals themselves are in `take`)."""
        try:
            while self._wakeup is not None and self._wakeup[0].recv(4096):
                pass
        except BlockingIOError:
            pass

    def take(self) -> list[signal.Signals]:
        """The signals recorded since the last call, oldest first."""
        taken, self._pending = self._pending, []
        return [signal.Signals(s) for s in taken]

    def restore(self) -> None:
        """Default dispositions again; a no-op unless installed."""
        if self._wakeup is None:
            return
        signal.set_wakeup_fd(-1)
        for sig in self.handled:
            signal.signal(sig, signal.SIG_DFL)
        for sock in self._wakeup:
            sock.close()
        self._wakeup = None


class ChildSignals(RecordedSignals):
    """A child's SIGTERM: recorded as a stop, unless the supervisor marked `slot` for a kill
    (see the module docstring)."""

    def __init__(self, slot: JobSlot) -> None:
        super().__init__((signal.SIGTERM,))
        self.slot = slot
        self.reader: socket.socket | None = None

    def install(self) -> socket.socket:
        self.reader = super().install()
        return self.reader

    def _record(self, signum: int, frame: object) -> None:
        if self.slot.kill_marked:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
        super()._record(signum, frame)

    @property
    def pending(self) -> bool:
        """A SIGTERM was recorded and not taken yet (no system call: the hot path asks)."""
        return bool(self._pending)
