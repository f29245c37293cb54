"""Creating the folders a command writes into, with the user's key in the message when the OS refuses."""

from __future__ import annotations

from pathlib import Path

from sanarl.errors import UserError


def make_dir(path: Path, chosen_by: str) -> Path:
    """`mkdir -p path`; an OS refusal is bad input (exit code 2) naming `chosen_by`, the key or option that chose
    the folder (`train.output_dir = '...'`, `--output ...`)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(
            f"`{chosen_by}` cannot be created ({err.strerror}); choose another directory."
        ) from None
    return path
