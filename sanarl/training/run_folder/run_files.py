"""Writing a run's own files (config.toml, metrics.jsonl, resumes.jsonl, metrics.png) safely.

A whole file is written to a fresh temporary file beside it (created exclusively, so never through a link) and
renamed over the name: a link planted at the name is replaced, never followed, and a kill or a full disk leaves
the old file whole. A line is appended through a descriptor opened with `O_NOFOLLOW`: a link planted at the name
stops the run with exit code 2 naming it. A full disk is reported as bad input (exit code 2) naming the folder.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from sanarl.errors import UserError
from sanarl.training.faults import fail_point

FULL_DISK = (errno.ENOSPC, errno.EDQUOT)


def is_disk_full(err: BaseException) -> bool:
    """Whether `err` (an OSError, or a library's error carrying its text) says the disk or quota is full."""
    text = getattr(err, "strerror", None) or str(err)
    return getattr(err, "errno", None) in FULL_DISK or "No space left" in text or "Disk quota" in text


def disk_full_error(folder: Path, what: str, err: BaseException) -> UserError:
    """The exit-2 error of a write that failed at `folder`; `what` says what was not written and what is intact."""
    text = getattr(err, "strerror", None) or str(err)
    head = "disk full" if is_disk_full(err) else f"cannot write ({text})"
    return UserError(
        f"{head} at {folder}: {what}. Free space there or set `train.output_dir` to a larger disk (copy the run "
        "directory along), then rerun with `train.resume = true`."
    )


def link_error(path: Path) -> UserError:
    target = os.readlink(path) if path.is_symlink() else "?"
    return UserError(
        f"{path} is a symbolic link (to {target}); sanarl writes a run's files itself, never through a link. "
        "Remove the link, or choose another `train.output_dir`."
    )


@contextlib.contextmanager
def replacing(path: Path, fail_at: str = "") -> Iterator[Path]:
    """A fresh temporary path beside `path` to write the new content to; renamed over `path` when the block ends
    without error, removed otherwise. `fail_at`: the fault point (sanarl/training/faults.py) inside the write."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    temp = Path(name)
    mask = os.umask(0)
    os.umask(mask)
    temp.chmod(0o666 & ~mask)  # the modes a plain new file gets (mkstemp makes it 0600)
    try:
        yield temp
        if fail_at:
            fail_point(fail_at, temp)
        with temp.open("rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def write_file(path: Path, data: str | bytes, fail_at: str = "") -> None:
    """Replace `path` with `data` atomically, never through a link (module docstring)."""
    raw = data.encode() if isinstance(data, str) else data
    with replacing(path, fail_at) as temp:
        temp.write_bytes(raw)


def append_line(path: Path, line: str) -> None:
    """Append `line` (a newline added) to `path`, created when missing; a link at `path` is refused.

    Raises:
        UserError: `path` is a symbolic link.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise link_error(path) from None
        raise
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


REPLACED = ("config.toml", "resumes.jsonl", "metrics.png")
"""The run files written whole through `replacing` (their temporary files are `.<name>.*.tmp`)."""


def remove_stale_temporaries(run_dir: Path) -> None:
    """Remove the temporary files a kill left beside the files of REPLACED (the run's start, under its lock)."""
    for name in REPLACED:
        for temp in run_dir.glob(f".{name}.*.tmp"):
            temp.unlink(missing_ok=True)


def saved_via_temp(path: Path, save: Callable[[Path], object]) -> None:
    """`save(temp)` (a library writing a whole file by name, e.g. a figure) then the rename over `path`."""
    with replacing(path) as temp:
        save(temp)
