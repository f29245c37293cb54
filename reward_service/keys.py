"""Redis key names of the service (all under one prefix, so several services can share a Redis).

A *task* is one (request uuid, reward) pair; its queue item is the string `"<reward>|<uuid>|<B>"`.

    task:<uuid>         hash: header (JSON), created (Redis time, s), n (B), rewards (JSON list),
                        remaining (tasks not finished), s:<reward> (queued|done|failed), a:<reward> (crashes),
                        sig (the API's MAC of header and pixels, signing.task_signature)
    blob:<uuid>         the npy bytes (deleted when every task of the request finished)
    queue:<reward>      list of queue items; LPUSH at enqueue, workers take from the right (FIFO)
    wake:<reward>       list of wake-up tokens workers block on (BLPOP), one pushed per queued task: its uuid
                        (the woken worker reads that request's pixels with its claim), '1' from the reaper
    proc:<worker>       the worker's processing list: items it holds (moved there atomically when claimed)
    hb:<worker>         heartbeat, expires after workers.visibility_timeout_s
    workers             hash worker id -> JSON {rewards, pid, host, started}
    rewards             hash reward -> JSON {keys, default_key}, written by workers at start
    result:<uuid>:<reward>   "<MAC>.<JSON>" (signing.sign): JSON {"status": "done", "result": {...}} or
                        {"status": "failed", "error": ...}, TTL
    rid:<request id>    "<uuid>|<sha256 of the body>" (idempotent enqueue)
    pending             number of queue items in every queue and processing list
    lat:<reward>        recent "end_to_end_s,score_s" samples (at most 256)
    done                pub/sub channel, message "<uuid>|<reward>" when a task finishes (a scored or failed
                        task adds "\n<the stored result JSON>")
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TASK_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""A request's uuid as the API makes them (`uuid.uuid4()`): the wake-up tokens of queued tasks."""
WAKE_CAP = 4096
"""Most wake-up tokens kept per reward (tokens only shorten the workers' sleep on BLPOP)."""


@dataclass(frozen=True)
class Keys:
    """Key builder for one prefix."""

    prefix: str

    def task(self, uuid: str) -> str:
        return f"{self.prefix}task:{uuid}"

    def blob(self, uuid: str) -> str:
        return f"{self.prefix}blob:{uuid}"

    def queue(self, reward: str) -> str:
        return f"{self.prefix}queue:{reward}"

    def wake(self, reward: str) -> str:
        return f"{self.prefix}wake:{reward}"

    def proc(self, worker: str) -> str:
        return f"{self.prefix}proc:{worker}"

    def heartbeat(self, worker: str) -> str:
        return f"{self.prefix}hb:{worker}"

    def result(self, uuid: str, reward: str) -> str:
        return f"{self.prefix}result:{uuid}:{reward}"

    def request_id(self, rid: str) -> str:
        return f"{self.prefix}rid:{rid}"

    def latency(self, reward: str) -> str:
        return f"{self.prefix}lat:{reward}"

    @property
    def workers(self) -> str:
        return f"{self.prefix}workers"

    @property
    def rewards(self) -> str:
        return f"{self.prefix}rewards"

    @property
    def pending(self) -> str:
        return f"{self.prefix}pending"

    @property
    def channel(self) -> str:
        return f"{self.prefix}done"


def queue_item(reward: str, uuid: str, count: int) -> str:
    """The queue item of task (uuid, reward) with `count` images."""
    return f"{reward}|{uuid}|{count}"


def split_item(item: str) -> tuple[str, str, int]:
    """`"<reward>|<uuid>|<B>"` -> (reward, uuid, B)."""
    reward, uuid, count = item.split("|")
    return reward, uuid, int(count)
