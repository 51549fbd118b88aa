"""Signal handlers that only record: the supervisor's loop acts on what they recorded.

Python runs a handler between bytecodes of the main thread, so a handler that reaped, spawned
or logged could interleave with the loop doing the same. These append the signal number to a
list and let `signal.set_wakeup_fd` write a byte to a socket the loop's selector watches.
"""

from __future__ import annotations

import signal
import socket

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGTTIN, signal.SIGTTOU)


class RecordedSignals:
    def __init__(self) -> None:
        self._pending: list[int] = []
        self._wakeup: tuple[socket.socket, socket.socket] | None = None

    def install(self) -> socket.socket:
        """Record HANDLED from now on (main thread only). Returns the socket to select on."""
        self._wakeup = reader, writer = socket.socketpair()
        for sock in self._wakeup:
            sock.setblocking(False)
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        for sig in HANDLED:
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
        for sig in HANDLED:
            signal.signal(sig, signal.SIG_DFL)
        for sock in self._wakeup:
            sock.close()
        self._wakeup = None
