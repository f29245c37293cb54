"""Make the `image-reward` 1.5 package (ImageReward, Xu et al. 2023) importable and runnable with transformers 5.

image-reward 1.5 was written for transformers 4.2x. Against transformers 5 it breaks in three places:

1. import time: `ImageReward/models/BLIP/med.py` imports `apply_chunking_to_forward`, `prune_linear_layer` and
   `find_pruneable_heads_and_indices` from `transformers.modeling_utils`. The first two moved to
   `transformers.pytorch_utils`; the third was removed. `apply_shim()` puts the first two back under their old name
   and adds our own `find_pruneable_heads_and_indices` (same contract: head set and kept-row index).
2. construction: med's `BertModel.__init__` calls `init_weights()`, which in transformers 5 reads the
   `all_tied_weights_keys` attribute that only `post_init()` sets; med never calls `post_init()`.
3. forward: med calls `self.invert_attention_mask` and `self.get_head_mask`, both removed from `PreTrainedModel`.

Fixes 2 and 3 are attached to med's own `BertPreTrainedModel` class only (never to transformers' classes), by
`patch_med(module)` after import. Importing the package's `__init__` also pulls in its training script (needs
`datasets`, `diffusers`) and `openai-clip` (needs `pkg_resources`, i.e. setuptools<81); `import_image_reward()`
avoids both by importing only the two modules the reward needs (`ImageReward.ImageReward` and its BLIP model)
with the parent packages registered bare, then removes those bare parents so a later plain `import ImageReward`
still runs the real `__init__` (which then finds the shimmed submodules already loaded).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Iterable
from types import ModuleType
from typing import Any

import torch

_MOVED = ("apply_chunking_to_forward", "prune_linear_layer")
_lock = threading.Lock()


def find_pruneable_heads_and_indices(
    heads: Iterable[int], n_heads: int, head_size: int, already_pruned_heads: Iterable[int]
) -> tuple[set[int], torch.Tensor]:
    """Heads still to prune and the indices of the rows (of a `[n_heads * head_size, ...]` projection) to keep.

    `heads` are original head numbers; `already_pruned_heads` are gone from the layer, so a head's current
    position is its number minus the count of already-pruned heads below it. Returns `(heads - already_pruned,
    LongTensor of kept row indices, ascending)`.
    """
    pruned = set(already_pruned_heads)
    to_prune = set(heads) - pruned
    current = {h - sum(1 for p in pruned if p < h) for h in to_prune}
    keep = [i for i in range(n_heads * head_size) if i // head_size not in current]
    return to_prune, torch.tensor(keep, dtype=torch.long)


def apply_shim() -> None:
    """Put the names image-reward imports back into `transformers.modeling_utils` (idempotent)."""
    import transformers.modeling_utils as modeling_utils
    import transformers.pytorch_utils as pytorch_utils

    for name in _MOVED:
        if not hasattr(modeling_utils, name):
            setattr(modeling_utils, name, getattr(pytorch_utils, name))
    if not hasattr(modeling_utils, "find_pruneable_heads_and_indices"):
        modeling_utils.find_pruneable_heads_and_indices = find_pruneable_heads_and_indices


def _invert_attention_mask(self: Any, mask: torch.Tensor) -> torch.Tensor:
    """1 = attend, 0 = ignore `[B, S]` or `[B, S, S]` -> additive mask `[B, 1, 1, S]` / `[B, 1, S, S]` in the
    model dtype: 0 where attended, the dtype's most negative value where ignored (transformers 4 semantics)."""
    extended = mask[:, None, None, :] if mask.dim() == 2 else mask[:, None, :, :]
    extended = extended.to(dtype=self.dtype)
    return (1.0 - extended) * torch.finfo(self.dtype).min


def _get_head_mask(self: Any, head_mask: torch.Tensor | None, num_layers: int) -> Any:
    """None -> `[None] * num_layers`; `[heads]` or `[layers, heads]` -> `[layers, 1, heads, 1, 1]` (1 = keep)."""
    if head_mask is None:
        return [None] * num_layers
    if head_mask.dim() == 1:
        head_mask = head_mask[None].expand(num_layers, -1)
    return head_mask[:, None, :, None, None].to(dtype=self.dtype)


def patch_med(med: ModuleType) -> None:
    """Give image-reward's `med.BertPreTrainedModel` what transformers 5 no longer provides (idempotent)."""
    cls = med.BertPreTrainedModel
    if not hasattr(cls, "all_tied_weights_keys"):
        cls.all_tied_weights_keys = {}
    if not hasattr(cls, "invert_attention_mask"):
        cls.invert_attention_mask = _invert_attention_mask
    if not hasattr(cls, "get_head_mask"):
        cls.get_head_mask = _get_head_mask


def _bare_package(name: str, path: str) -> ModuleType:
    """A package module for `name` whose `__init__` is not run (submodules import normally)."""
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = [path]
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    return module


def import_image_reward() -> tuple[ModuleType, ModuleType, ModuleType]:
    """`(ImageReward.ImageReward, ImageReward.models.BLIP.blip_pretrain, ImageReward.models.BLIP.vit)`, shimmed.

    Use the returned modules (not `from ImageReward... import`, which would run the package `__init__`).

    Raises ModuleNotFoundError when image-reward (or timm / fairscale, which its BLIP imports) is not installed.
    """
    with _lock:
        apply_shim()
        spec = importlib.util.find_spec("ImageReward")
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError("No module named 'ImageReward'", name="ImageReward")
        root = list(spec.submodule_search_locations)[0]
        created = []
        for name, path in (("ImageReward", root), ("ImageReward.models", f"{root}/models")):
            if name not in sys.modules:
                _bare_package(name, path)
                created.append(name)
        try:
            image_reward = importlib.import_module("ImageReward.ImageReward")
            blip = importlib.import_module("ImageReward.models.BLIP.blip_pretrain")
            vit = importlib.import_module("ImageReward.models.BLIP.vit")
            patch_med(importlib.import_module("ImageReward.models.BLIP.med"))
        finally:
            for name in created:
                sys.modules.pop(name, None)
        return image_reward, blip, vit
