"""Test plugin: one colored square per image, centred, with its color in the caption (deterministic by index)."""

import torch

COLORS = {
    "red": (1.0, 0.1, 0.1),
    "green": (0.1, 0.9, 0.1),
    "blue": (0.1, 0.2, 1.0),
    "yellow": (1.0, 0.9, 0.1),
}
NAMES = list(COLORS)


class Squares(torch.utils.data.Dataset):
    def __init__(self, size: int, n: int = 64) -> None:
        self.size, self.n = size, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        name = NAMES[i % len(NAMES)]
        img = torch.zeros(3, self.size, self.size)
        q = self.size // 4
        img[:, q : 3 * q, q : 3 * q] = torch.tensor(COLORS[name]).view(3, 1, 1)
        return {"prompt": f"a {name} square", "image": img}


def get_dataset(config):
    return Squares(config.policy.diffusers.inference_size[0])
