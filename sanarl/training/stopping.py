"""Orderly stops: SIGINT (Ctrl-C) and SIGTERM (the usual preemption signal of clusters) during the training loop.

The first signal is recorded and the loop stops at the next step boundary, where every rank agrees (a max-reduce
of the signal number, so a signal that reached one rank stops all of them at the same step): the runner writes a
final checkpoint collectively and raises `Interrupted` (exit code 128 + signal: 130 for SIGINT, 143 for SIGTERM).
A second signal acts at once, as without the handler (Ctrl-C twice: KeyboardInterrupt; SIGTERM twice: the
process ends); the checkpoint being written, if any, is atomic. Under `accelerate launch` / torchrun the launcher
forwards the signal to every rank and kills them after its grace period (torchrun: 30 s), which the final save
must fit in.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

import torch

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def write_unlocked(text: str) -> None:
    """Write a line straight to file descriptor 2: a signal handler may run while the main thread holds the lock
    of sys.stdout / sys.stderr or of a console (in the middle of a progress bar), where print would raise
    "reentrant call" or deadlock."""
    with contextlib.suppress(OSError):
        os.write(2, f"{text}\n".encode())


class StopRequests:
    """The signal asked to stop the run (None: none yet), recorded by handlers `installed` for a block. The
    handler takes no lock: it records the signal and writes its notice with `write_unlocked`."""

    def __init__(self, notice=write_unlocked) -> None:
        self.signum: int | None = None
        self._notice = notice
        self._previous: dict[int, object] = {}

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopRequests]:
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            yield self
            return
        self._previous = {s: signal.getsignal(s) for s in SIGNALS}
        for s in SIGNALS:
            signal.signal(s, self._handle)
        try:
            yield self
        finally:
            for s, handler in self._previous.items():
                signal.signal(s, handler)

    def _handle(self, signum: int, frame) -> None:
        if self.signum is not None:  # the second one: as if sanarl had installed nothing
            signal.signal(signum, self._previous.get(signum) or signal.SIG_DFL)
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            signal.raise_signal(signum)
            return
        self.signum = signum
        self._notice(
            f"{signal.Signals(signum).name} received: stopping after this step with a checkpoint "
            "(send it again to stop at once)"
        )

    def agreed(self, device: torch.device, world: int) -> int:
        """The signal number any rank recorded (0: none), the same on every rank (a collective when world > 1)."""
        if world == 1:
            return self.signum or 0
        flag = torch.tensor([float(self.signum or 0)], device=device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return int(flag.item())
