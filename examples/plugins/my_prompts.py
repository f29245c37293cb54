"""A small custom dataset plugin: RL prompts read from a text file, one prompt per line.

Run it (the plugin is the positional argument, given here as a path to this file):

    sanarl --config tiny-shapes-nft \
        --set train.train_policy.dataset.local_dir=my_prompts.txt \
        examples/plugins/my_prompts.py

`train.train_policy.dataset.local_dir` names the prompt file (Cosmos-RL's key for "where the data is"; a file is
fine). Blank lines are skipped and surrounding whitespace is stripped. `validation.dataset.local_dir`, if set, names
a second file for validation prompts.

Items are RL items: `{"prompt": str, "metadata": {}}`. The metadata dict is forwarded to the reward functions; this
plugin has nothing to say to them, so it is empty. No `collate` is defined, so sanarl's default is used (it keeps
"prompt" and "metadata" as lists).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from sanarl.config.schema import Config
from sanarl.errors import DataError


class PromptFile(Dataset):
    """The non-blank lines of a UTF-8 text file, one RL prompt each."""

    def __init__(self, path: str, key: str) -> None:
        if not path:
            raise DataError(f"`{key}` is empty: set it to a .txt file with one prompt per line.")
        file = Path(path).expanduser()
        if not file.is_file():
            raise DataError(
                f"`{key}` = {path!r}: no such file. Point it to a .txt file with one prompt per line."
            )
        lines = file.read_text(encoding="utf-8").splitlines()
        self.prompts = [line.strip() for line in lines if line.strip()]
        if not self.prompts:
            raise DataError(
                f"`{key}` = {path!r}: the file has no prompts (only blank lines). Add one per line."
            )

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"prompt": self.prompts[index], "metadata": {}}


def get_dataset(config: Config) -> Dataset:
    """Required factory: the training prompts. `config` is the whole resolved sanarl Config."""
    return PromptFile(config.train.train_policy.dataset.local_dir, "train.train_policy.dataset.local_dir")


def get_val_dataset(config: Config) -> Dataset | None:
    """Optional factory: validation prompts, or None when `validation.dataset.local_dir` is unset."""
    path = config.validation.dataset.local_dir
    return PromptFile(path, "validation.dataset.local_dir") if path else None
