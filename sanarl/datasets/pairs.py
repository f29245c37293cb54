"""The pair form of a dataset plugin's items, read by the offline Diffusion-DPO method (docs/plugins.md, "Pair
items"; docs/dpo.md).

A pair item is `{"prompt": str, "chosen": FloatTensor[3, H, W], "rejected": FloatTensor[3, H, W]}` with values in
[0, 1] and [H, W] = `policy.diffusers.inference_size` (an optional `"metadata": dict` is carried along). `chosen` is
the image preferred for the prompt, `rejected` the other one; with `policy.diffusers.is_video` both are clips
[3, T, H, W] (T = `policy.diffusers.train_frames`). The default `collate` stacks both
(`common.STACKED_KEYS`). `check_pair_item` is the one check of that form: the start of a run and `sanarl validate`
run it on the first training item before any model loads, and the task runs it again when built in code.
"""

from __future__ import annotations

from typing import Any

import torch

from sanarl.errors import DataError

PAIR_KEYS: tuple[str, str] = ("chosen", "rejected")
"""The two images of a pair item: the preferred one, then the other."""
PAIR_PLUGINS = (
    "sanarl.datasets.shapes_pairs (the shapes world, CPU) or sanarl.datasets.preference_jsonl (your JSONL)"
)
"""The shipped pair plugins, as messages name them."""


def wants_pairs(policy_type: str, trainer_type: str) -> bool:
    """Whether the method `(train.train_policy.type, trainer_type)` trains on pair items: offline DPO."""
    return (policy_type, trainer_type) == ("sft", "dpo")


def check_pair_item(item: Any, plugin: str) -> None:
    """`item` (a plugin's training item) has the pair form of the module docstring.

    Raises:
        DataError: naming `plugin`, what the item lacks and the fix: a prompt-only or image-caption item (no pair
            keys at all), a pair item without its rejected (or chosen) image, or images that are not [3, H, W]
            tensors of one shape.
    """
    keys = sorted(item) if isinstance(item, dict) else []
    have = [k for k in PAIR_KEYS if isinstance(item, dict) and k in item]
    form = ('{"prompt": str, "chosen": FloatTensor[3, H, W], "rejected": FloatTensor[3, H, W]} with values in '
            "[0, 1] (docs/plugins.md, \"Pair items\")")  # fmt: skip
    if not have:
        raise DataError(
            f"dataset plugin {plugin} gives items with keys {keys}, not preference pairs: offline DPO "
            f"(trainer_type = 'dpo', type = 'sft') trains on pair items {form}. Use a pair plugin, "
            f"{PAIR_PLUGINS}, or train online from prompts with train.train_policy.type = 'grpo' "
            "(preset tiny-shapes-dpo-online)."
        )
    missing = [k for k in PAIR_KEYS if k not in have]
    if missing:
        raise DataError(
            f"dataset plugin {plugin} gives items without a `{missing[0]}` image (item 0 has keys {keys}): a DPO "
            f"pair item is {form}. Return both images of each pair from the plugin's `__getitem__`."
        )
    shapes = [getattr(item[k], "shape", None) for k in PAIR_KEYS]
    ok = all(
        isinstance(item[k], torch.Tensor) and item[k].ndim in (3, 4) and item[k].shape[0] == 3
        for k in PAIR_KEYS
    )
    if not ok or shapes[0] != shapes[1]:
        got = ", ".join(
            f"{k} {list(s) if s is not None else type(item[k]).__name__}"
            for k, s in zip(PAIR_KEYS, shapes, strict=True)
        )
        raise DataError(
            f"dataset plugin {plugin} gives pair images of {got}: both must be float tensors [3, H, W] (or clips [3, T, "
            f"H, W]) of one shape, as in {form}."
        )
    if not isinstance(item.get("prompt"), str):
        raise DataError(
            f"dataset plugin {plugin} gives pair items without a `prompt` string: a pair item is {form}."
        )
