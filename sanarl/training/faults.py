"""Fault-injection points for the crash tests (docs/reliability.md): inert unless a test sets the variables.

`SANARL_TEST_PAUSE_AT=<point>`: the process stops at `<point>` (first passage), writes the point's name into the
file `SANARL_TEST_PAUSE_FILE` (when set) and sleeps, so the test can kill it exactly there.
`SANARL_TEST_FAIL_AT=<point>`: an `OSError(ENOSPC)` is raised at `<point>` (a full disk, without filling one).

Pause points: `step_<N>` (step N logged, its checkpoint not yet written), `checkpoint_swap` (an existing
checkpoint moved aside, the new one not yet in place), `rotation_delete` (a rotated-out checkpoint renamed to
`.retiring-*` and its meta.json deleted, the rest not yet), `metrics_rewrite` (the trimmed metrics.jsonl written to
its temporary file, not yet in place), `export_staged` (the new export complete in its staging folder),
`export_swap` (the old export moved aside, the new one not yet in place).
Failure points: `checkpoint_write` (inside the staging directory, a tensor file written), `export_write` (the
export written into its staging folder), `resume_record` (resumes.jsonl's new content in its temporary file),
`config_write` (config.toml's new content in its temporary file).
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

PAUSE_AT = "SANARL_TEST_PAUSE_AT"
PAUSE_FILE = "SANARL_TEST_PAUSE_FILE"
FAIL_AT = "SANARL_TEST_FAIL_AT"


def pause_point(name: str) -> None:
    """Stop here for good when the test asked to (it kills the process)."""
    if os.environ.get(PAUSE_AT) != name:
        return
    marker = os.environ.get(PAUSE_FILE)
    if marker:
        Path(marker).write_text(name)
    while True:
        time.sleep(1.0)


def fail_point(name: str, where: Path) -> None:
    """Raise the error of a full disk at `where` when the test asked to."""
    if os.environ.get(FAIL_AT) == name:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(where))
