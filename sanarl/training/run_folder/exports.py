"""The run's `export/` folder, written as checkpoints are: staged, then renamed into place.

The export is written into a hidden `.export-staging-*` folder of the run directory, every file synced, then renamed
to `export/`; an existing `export/` is moved aside to `.old-export` first and deleted after (`checkpoint_store.swap_in`).
A kill at any point leaves the old export or the new one whole, never a mix (a kill between the two renames
leaves the old one as `.old-export`, which `recover_export` puts back at the next start). A full disk stops the run
with exit code 2 and leaves the old export as it was.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from safetensors import SafetensorError

from sanarl.training.faults import fail_point, pause_point
from sanarl.training.run_folder.checkpoint_store import ASIDE, swap_in, umask_modes
from sanarl.training.run_folder.run_files import disk_full_error

EXPORT = "export"
STAGING = ".export-staging-"


def write_export(run_dir: Path, write: Callable[[Path], None]) -> Path:
    """`write(folder)` into a staging folder that then replaces `run_dir/export` (module docstring).

    Raises:
        UserError: the disk is full or not writable (the staging folder is removed, the old export intact).
    """
    target = run_dir / EXPORT
    staging = Path(tempfile.mkdtemp(prefix=STAGING, dir=run_dir))
    try:
        write(staging)
        fail_point("export_write", staging)
        _fsync_files(staging)
        umask_modes(staging)
        pause_point("export_staged")
        swap_in(staging, target, pause="export_swap")
    except (OSError, SafetensorError) as err:
        kept = f"{target} is as it was" if target.exists() else f"no {target} was written"
        raise disk_full_error(
            run_dir, f"the export was not written ({kept}; the checkpoints are intact)", err
        ) from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _fsync_files(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())


def recover_export(run_dir: Path) -> list[str]:
    """Undo what a kill left of an export: `.old-export` put back when `export/` never arrived (else removed),
    staging folders removed. Returns notices of what was repaired."""
    notices = []
    target, aside = run_dir / EXPORT, run_dir / (ASIDE + EXPORT)
    if aside.is_dir() and not target.exists():
        os.replace(aside, target)
        notices.append(f"restored {target} (an export that replaced it was killed mid-way)")
    elif aside.exists():
        shutil.rmtree(aside, ignore_errors=True)
    for staging in sorted(run_dir.glob(STAGING + "*")):
        shutil.rmtree(staging, ignore_errors=True)
        notices.append(f"removed {staging} (an interrupted export)")
    return notices
