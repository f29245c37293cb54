"""Atomic checkpoints with checksums and rotation; their verification and the repair of a killed save.

Layout of one checkpoint `<output_dir>/checkpoints/step_00000100/`:
  `<group>.safetensors`  named tensor groups (trainable weights, LoRA adapters, EMA shadow)
  `state.pt`             torch-serialised optimizer / LR-scheduler state (weights_only loadable)
  `<name>.pt`            extra torch-serialised state, weights_only loadable (`guard.pt`: the reward-hacking
                         guard's history, sanarl/training/guard.py)
  `meta.json`            step, data position, the run's config and plugin, and `files`: the sha256 of every other
                         file; written last
A checkpoint is written into a hidden staging directory `.staging-*` and renamed into place. Overwriting an
existing `step_N` (a re-run of a finished run, a rewind) moves the old one aside to `.old-step_N` first, renames the
new one in, then deletes the old: at every instant either the old or the new checkpoint is whole, and
`recover_root` (run at start) puts the old one back when a kill came between the two renames. A kill mid-save
leaves only a `.staging-*` directory, which `recover_root` removes. Rotation renames a checkpoint to
`.retiring-step_N` before deleting it, so a kill mid-deletion leaves a folder `recover_root` removes too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import zipfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from sanarl.errors import UserError
from sanarl.training.faults import fail_point, pause_point
from sanarl.training.run_folder.run_files import is_disk_full

PREFIX = "step_"
STAGING = ".staging-"
ASIDE = ".old-"
RETIRING = ".retiring-"
"""Rotation renames a checkpoint to `.retiring-step_N` before deleting it; `recover_root` finishes a killed deletion."""
FORMAT = 2
"""meta.json's `format`: 2 = its `files` list holds the checksum of every other file (older checkpoints: none)."""
RETIRED = "retired"
"""Checkpoints a run no longer uses (damaged, or of an abandoned timeline) move to `checkpoints/retired/...`."""


class CheckpointError(UserError):
    """A checkpoint cannot be written (disk full, no permission) or read (damaged)."""


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def checkpoint_step(path: Path) -> int | None:
    """The step a `step_NNNNNNNN` directory's name gives, None for any other name."""
    digits = path.name[len(PREFIX) :]
    return int(digits) if path.name.startswith(PREFIX) and digits.isdigit() else None


def list_checkpoints(root: Path) -> list[Path]:
    """Checkpoints under `root` (directories `step_N` with a meta.json), oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if checkpoint_step(p) is not None and (p / "meta.json").is_file()]
    return sorted(found, key=checkpoint_step)


# --- writing -----------------------------------------------------------------------------------------------------
BLOCK = 1 << 26
"""Checksums hash 64 MiB blocks in parallel threads (hashlib releases the GIL), then the blocks' digests."""


def _torch_save(obj: Any, path: Path) -> None:
    with path.open("wb") as fh:
        torch.save(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())


def file_sha256(path: Path) -> str:
    """The checksum meta.json records for a file: sha256 over the sha256 digests of its 64 MiB blocks (hashed on
    up to 8 threads at once)."""
    size = path.stat().st_size

    def block(index: int) -> bytes:
        with path.open("rb") as fh:
            fh.seek(index * BLOCK)
            return hashlib.sha256(fh.read(BLOCK)).digest()

    count = max(1, -(-size // BLOCK))
    if count == 1:
        digests = [block(0)]
    else:
        with ThreadPoolExecutor(max_workers=min(8, count)) as pool:
            digests = list(pool.map(block, range(count)))
    return hashlib.sha256(b"".join(digests)).hexdigest()


def _write_staging(
    staging: Path,
    tensors: dict[str, dict[str, torch.Tensor]],
    torch_state: dict[str, Any],
    meta: dict[str, Any],
    extras: Mapping[str, Any],
) -> None:
    files: dict[str, str] = {}
    for group, named in tensors.items():
        path = staging / f"{group}.safetensors"
        save_file({k: v.detach().cpu().contiguous() for k, v in named.items()}, str(path))
        fail_point("checkpoint_write", path)
        with path.open("rb+") as fh:  # on disk before the rename publishes it
            os.fsync(fh.fileno())
    _torch_save(torch_state, staging / "state.pt")
    for name, obj in extras.items():
        _torch_save(obj, staging / f"{name}.pt")
    for path in sorted(staging.iterdir()):  # read back from the page cache
        files[path.name] = file_sha256(path)
    with (staging / "meta.json").open("w") as fh:
        json.dump({**meta, "format": FORMAT, "files": files}, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())


def umask_modes(root: Path) -> None:
    """Give `root` and everything under it the modes the umask gives a new file / directory (as config.toml
    gets): safetensors writes 0600 files and a staging directory is created 0700."""
    mask = os.umask(0)
    os.umask(mask)
    root.chmod(0o777 & ~mask)
    for path in root.rglob("*"):
        if not path.is_symlink():
            path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def swap_in(staging: Path, target: Path, pause: str = "checkpoint_swap") -> None:
    """Rename `staging` to `target`; an existing `target` is moved aside (to `.old-<name>`) first and deleted
    after. `pause`: the fault point between the two renames."""
    aside = target.with_name(ASIDE + target.name)
    if aside.exists() and not target.exists():  # a killed swap that recover_root has not repaired
        os.replace(aside, target)
    shutil.rmtree(aside, ignore_errors=True)
    if target.exists():
        os.replace(target, aside)
        pause_point(pause)
    os.replace(staging, target)
    shutil.rmtree(aside, ignore_errors=True)
    _fsync_dir(target.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    root: Path,
    step: int,
    tensors: dict[str, dict[str, torch.Tensor]],
    torch_state: dict[str, Any],
    meta: dict[str, Any],
    max_keep: int = 0,
    extras: Mapping[str, Any] | None = None,
) -> Path:
    """Write checkpoint `step` atomically (with `extras[name]` as `<name>.pt`) and delete the oldest beyond
    `max_keep` (0 = keep all).

    Raises:
        CheckpointError: the disk is full or not writable (the staging directory is removed; the checkpoints
            already there are untouched).
    """
    root.mkdir(parents=True, exist_ok=True)
    target = root / checkpoint_name(step)
    staging = Path(tempfile.mkdtemp(prefix=STAGING, dir=root))
    try:
        _write_staging(staging, tensors, torch_state, {**meta, "step": step}, extras or {})
        umask_modes(staging)
        swap_in(staging, target)
    except (OSError, SafetensorError) as err:
        raise _write_error(target, err) from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if max_keep > 0:
        for old in list_checkpoints(root)[:-max_keep]:
            _delete(old)
    return target


def _delete(checkpoint: Path) -> None:
    """Delete a checkpoint so that a kill at any point leaves either it whole or a `.retiring-` folder that
    `recover_root` removes: renamed first, its meta.json deleted next, the rest last."""
    gone = checkpoint.with_name(RETIRING + checkpoint.name)
    shutil.rmtree(gone, ignore_errors=True)
    os.replace(checkpoint, gone)
    (gone / "meta.json").unlink(missing_ok=True)
    pause_point("rotation_delete")
    shutil.rmtree(gone, ignore_errors=True)


def _write_error(target: Path, err: Exception) -> CheckpointError:
    text = getattr(err, "strerror", None) or str(err)
    what = "disk full" if is_disk_full(err) else f"cannot write ({text})"
    return CheckpointError(
        f"{what} at {target.parent}: checkpoint {target.name} was not written (its staging directory is removed, "
        "the checkpoints already there are intact). Free space there or set `train.output_dir` to a larger "
        "disk (copy the run directory along), then rerun with `train.resume = true`."
    )


# --- reading and verification ------------------------------------------------------------------------------------
def read_meta(path: Path) -> dict[str, Any]:
    """meta.json of checkpoint `path`, checked: a JSON object with a non-negative integer `step`.

    Raises:
        CheckpointError: naming the file and what is wrong with it.
    """
    file = path / "meta.json"
    try:
        meta = json.loads(file.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{file} is unreadable ({type(err).__name__})") from None
    step = meta.get("step") if isinstance(meta, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"{file} holds no valid step (a non-negative integer): {step!r}")
    named = checkpoint_step(path)
    if named is not None and named != step:
        raise CheckpointError(f"{file} says step {step} but the directory is {path.name}")
    return meta


def verify_checkpoint(path: Path, groups: tuple[str, ...] = ("model",)) -> str | None:
    """What is wrong with checkpoint `path` (None: intact): meta.json, the tensor `groups` and state.pt present,
    every file's sha256 as recorded at the save. A checkpoint of an older sanarl (no checksums) gets the
    structural checks only."""
    try:
        meta = read_meta(path)
    except CheckpointError as err:
        return str(err)
    files = meta.get("files")
    needed = [f"{g}.safetensors" for g in groups] + ["state.pt"]
    for name in needed:
        if not (path / name).is_file():
            return f"{path / name} is missing"
    if not isinstance(files, dict):
        if _format(meta) >= FORMAT:
            return f"{path / 'meta.json'} has lost its `files` list (the checksums this sanarl records)"
        return _legacy_problem(path)
    weights = {p.name for p in path.iterdir() if p.suffix in (".safetensors", ".pt")}
    for name in sorted(weights | set(needed)):
        if name not in files:
            return f"{path / name} has no checksum in meta.json (its entry in `files` is gone)"
    for name, digest in files.items():
        file = path / name
        if not file.is_file():
            return f"{file} is missing"
        if file_sha256(file) != digest:
            return f"{file} does not match its checksum in meta.json (damaged or replaced)"
    return None


def _format(meta: dict[str, Any]) -> int:
    value = meta.get("format", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) else FORMAT


def unverified_notice(path: Path) -> str | None:
    """The notice for a checkpoint whose files cannot be checked against checksums (an older sanarl's: its
    meta.json has no `files` list), None when they can."""
    if isinstance(read_meta(path).get("files"), dict):
        return None
    return (
        f"checkpoint {path.name} records no checksums (written by an older sanarl): its files are checked for "
        "structure only, damage inside a tensor cannot be found"
    )


def _legacy_problem(path: Path) -> str | None:
    for file in sorted(path.glob("*.pt")):
        problem = _torch_file_problem(file)
        if problem:
            return problem
    return None


def _torch_file_problem(file: Path) -> str | None:
    """A torch.save file is a zip archive: check it before torch.load (which aborts the process on some damage)."""
    try:
        with zipfile.ZipFile(file) as archive:
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile, EOFError) as err:
        return f"{file} is not a readable torch file ({type(err).__name__})"
    return f"{file} is damaged (member {bad} fails its CRC)" if bad else None


def load_checkpoint(path: Path) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, Any], dict[str, Any]]:
    """(tensor groups, torch state, meta) of a checkpoint directory.

    Raises:
        CheckpointError: a file is unreadable (naming it).
    """
    meta = read_meta(path)
    tensors = {}
    for file in sorted(path.glob("*.safetensors")):
        try:
            tensors[file.stem] = load_file(str(file))
        except (OSError, SafetensorError) as err:
            raise CheckpointError(f"{file} is not a readable safetensors file ({err})") from None
    state_file = path / "state.pt"
    problem = _torch_file_problem(state_file) if state_file.is_file() else f"{state_file} is missing"
    if problem:
        raise CheckpointError(problem)
    try:
        torch_state = torch.load(state_file, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001  (any unpickling failure of a damaged file)
        raise CheckpointError(f"{state_file} is not a readable torch file ({type(err).__name__})") from None
    return tensors, torch_state, meta


def load_extra(path: Path, name: str) -> Any | None:
    """The extra state `name` a checkpoint directory holds (`<name>.pt`), or None when it holds none.

    Raises:
        UserError: the file is there but unreadable (naming it and the fix).
    """
    file = path / f"{name}.pt"
    if not file.is_file():
        return None
    fix = (
        f"delete it to resume without its state ({name} starts afresh), or resume from another checkpoint with "
        "train.resume = <path>."
    )
    problem = _torch_file_problem(file)
    if problem:
        raise UserError(f"{file} is not a readable checkpoint file ({problem}); {fix}")
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001  (truncated, foreign or not a torch file: all the same to the user)
        raise UserError(f"{file} is not a readable checkpoint file ({type(err).__name__}); {fix}") from err


# --- repair and retirement ---------------------------------------------------------------------------------------
def recover_root(root: Path) -> list[str]:
    """Undo what a kill left under `root`: an old checkpoint moved aside whose replacement never arrived is put
    back, leftover aside copies and staging directories and empty `step_N` directories are removed. Returns
    notices of what was repaired."""
    if not root.is_dir():
        return []
    notices = []
    for aside in sorted(root.glob(ASIDE + PREFIX + "*")):
        target = root / aside.name[len(ASIDE) :]
        if target.exists():
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(aside, target)
            notices.append(f"restored {target} (a save that replaced it was killed mid-way)")
    for staging in [*root.glob(STAGING + "*"), *root.glob(RETIRING + "*")]:
        shutil.rmtree(staging, ignore_errors=True)
        what = "an interrupted save" if staging.name.startswith(STAGING) else "a deletion cut short by a kill"
        notices.append(f"removed {staging} ({what})")
    return notices + _without_meta(root)


def _without_meta(root: Path) -> list[str]:
    """`step_N` folders without meta.json: empty ones and those older than the newest checkpoint (what a kill
    inside an older sanarl's rotation left) are removed; a newer one is damage, moved to retired/ (notices)."""
    listed = list_checkpoints(root)
    newest = checkpoint_step(listed[-1]) if listed else -1
    notices, damaged = [], []
    for step_dir in sorted(root.glob(PREFIX + "*")):
        step = checkpoint_step(step_dir)
        if not step_dir.is_dir() or step is None or (step_dir / "meta.json").exists():
            continue
        if not any(step_dir.iterdir()):
            step_dir.rmdir()
            notices.append(f"removed the empty {step_dir}")
        elif step < newest:
            shutil.rmtree(step_dir, ignore_errors=True)
            notices.append(f"removed {step_dir}: it has no meta.json (a deletion by rotation cut short)")
        else:
            damaged.append(step_dir)
    folder = retire(damaged, root, "damaged")
    notices += [
        f"checkpoint {p.name} has no meta.json (damaged or deleted): it is not resumed from and moves to {folder}"
        for p in damaged
    ]
    return notices


def retire(paths: list[Path], root: Path, why: str) -> Path | None:
    """Move checkpoints out of rotation and resume's sight into `root/retired/<why>-<time>/`; returns that folder
    (None when there was nothing to move)."""
    if not paths:
        return None
    folder = root / RETIRED / f"{why}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    for path in paths:
        os.replace(path, folder / path.name)
    return folder


def resolve_resume(resume: bool | str, checkpoints_root: Path) -> Path | None:
    """The checkpoint `train.resume` designates, or None to start fresh (no verification: see
    sanarl/training/run_folder/resume.py).

    true: the newest checkpoint under `checkpoints_root` (None if there is none yet: a first run of a resumable
    preset starts fresh). A path: that checkpoint directory, or the newest inside a run / checkpoints directory.
    Raises ValueError with the fix when a given path holds no checkpoint.
    """
    if resume is False or resume == "":
        return None
    if resume is True:
        found = list_checkpoints(checkpoints_root)
        return found[-1] if found else None
    path = Path(str(resume)).expanduser()
    if (path / "meta.json").is_file():
        return path
    for candidate in (path, path / "checkpoints"):
        found = list_checkpoints(candidate)
        if found:
            return found[-1]
    raise ValueError(
        f'`train.resume = "{resume}"` holds no checkpoint (expected a `{PREFIX}NNNNNNNN` directory with meta.json, '
        "or a run directory containing checkpoints/); set `train.resume = true` to resume from this run's "
        "output_dir, or `false` to start fresh."
    )
