"""One run per output folder: an exclusive `fcntl.flock` on `<output_dir>/.lock`, held for the whole run.

The lock holder writes its pid (and host) into the file. The kernel drops the lock when the process dies, however
it dies (kill -9 included), so a stale lock file never blocks the next run. A symbolic link at the lock's name is
refused (exit code 2): opening through it would truncate its target. A second run into a locked folder stops
with exit code 2 naming the holder. On file systems without flock support (some network mounts) the lock degrades
to a notice.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from sanarl.errors import UserError
from sanarl.training.run_folder.folders import make_dir
from sanarl.training.run_folder.run_files import link_error

LOCK_NAME = ".lock"


@contextlib.contextmanager
def run_lock(run_dir: Path, notice=print) -> Iterator[None]:
    """Hold the lock of `run_dir` (created when missing; removed again at release when the run left nothing
    else in it)."""
    created = not run_dir.exists()
    make_dir(run_dir, f"train.output_dir = {str(run_dir)!r}")
    path = run_dir / LOCK_NAME
    try:  # never through a link planted at the name: it would truncate the link's target
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise link_error(path) from None
        raise
    try:
        if _acquire(fd, path, notice):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        yield
    finally:
        os.close(fd)  # releases the flock
        if created and [p.name for p in run_dir.iterdir()] == [LOCK_NAME]:
            path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                run_dir.rmdir()


def _acquire(fd: int, path: Path, notice) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "unknown"
        raise UserError(
            f"{path.parent} is in use by another run (pid and host: {holder}; lock file {path}). Wait for it "
            "to finish or stop it, or give this run another `train.output_dir`."
        ) from None
    except OSError as err:
        if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        notice(f"{path.parent}'s file system does not support locks; nothing stops a second run into it")
        return False
