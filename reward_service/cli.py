"""`sanarl-reward`: the asynchronous reward service (FastAPI + Redis + workers).

The service is tracked as its own piece of work and is not part of this release; the command says so and exits
with status 2 instead of starting something half-built. Rewards run in-process in the trainer meanwhile.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    sys.stderr.write(
        "sanarl-reward: the reward service is not available in this version of sanarl. Rewards are computed "
        "in-process by the trainer (set `train.train_policy.use_remote_reward = false`).\n"
    )
    raise SystemExit(2)
