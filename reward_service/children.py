"""Child processes that die with the service.

On Linux every child the service starts (the embedded redis-server, the workers) asks the kernel, between fork
and exec, for SIGTERM when the thread that started it ends (`prctl(PR_SET_PDEATHSIG)`): a kill -9 of the service
leaves no redis-server or worker behind. Elsewhere the workers still notice a dead parent within a second; a
redis-server there outlives a kill -9.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
"""prctl option: the signal a process gets when its parent (the thread that forked it) exits."""


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen that arms PR_SET_PDEATHSIG = SIGTERM (None off Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    parent = os.getpid()

    def arm() -> None:
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return arm
