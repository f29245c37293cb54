"""Signed results: a result stored in Redis is served only when its HMAC checks out.

Redis is the queue, not a trusted party: whoever can write to it (a local process, a shared Redis' other users)
could otherwise store `{"status": "done", "result": {"scores": ...}}` under a task's result key and the API would
serve it. Workers, the reaper and the API therefore store every result as `<hex HMAC-SHA256>.<result JSON>`,
the MAC taken over the task's uuid, the reward name and the JSON, with a key derived from the service's bearer
token (`result_key`). The key never goes to Redis; every instance and worker that shares a Redis shares the token
and so the key. The API refuses (never serves) a stored value whose MAC fails, and the worker that scores such a
task replaces the forged value with its own result. The API signs each queued request too (`task_signature`, over
its header and pixels), and workers refuse to score one whose data changed in Redis after enqueue.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
from typing import Any

CONTEXT = b"sanarl reward service: result signature v1"
"""Domain separation: the result key is HMAC(token, CONTEXT), never the token itself."""


class ForgedResult(ValueError):
    """A stored result whose signature does not check out (not written by this service's workers)."""


def result_key(token: str) -> bytes:
    """The key results are signed with, derived from the bearer token."""
    return hmac.new(token.encode(), CONTEXT, hashlib.sha256).digest()


def _mac(key: bytes, task_uuid: str, reward: str, message: bytes) -> str:
    return hmac.new(key, f"{task_uuid}|{reward}\n".encode() + message, hashlib.sha256).hexdigest()


def sign(key: bytes, task_uuid: str, reward: str, message: str) -> str:
    """The stored form of result JSON `message` of task (task_uuid, reward)."""
    return f"{_mac(key, task_uuid, reward, message.encode())}.{message}"


def open_result(key: bytes, task_uuid: str, reward: str, stored: bytes) -> dict[str, Any]:
    """The result dict of a stored value; ForgedResult when its MAC does not match this task and key."""
    mac, dot, message = stored.partition(b".")
    expected = _mac(key, task_uuid, reward, message).encode()
    if not dot or not hmac.compare_digest(mac, expected):
        raise ForgedResult(f"the stored result of task {task_uuid} ({reward}) fails its signature check")
    return json.loads(message)


def pixels_digest(npy: bytes) -> bytes:
    """SHA-256 of a request's npy bytes: hashed once per enqueue (the task signature and the request id's body
    digest both take it) and once by the worker that checks the signature."""
    return hashlib.sha256(npy).digest()


def body_digest(json_line: bytes, pixels: bytes) -> str:
    """What a request id remembers of its body: SHA-256 over the JSON line and `pixels_digest` of the npy (a
    reused id with other prompts or pixels is a conflict), without hashing the pixels a second time."""
    return hashlib.sha256(json_line + pixels).hexdigest()


class BodyDigests:
    """The digests of one enqueue body (`body`, whose npy part is `npy`), each computed once, when first asked for:
    `pixels` (`pixels_digest`: the queue broker signs every task with it) and `request` (`body_digest`, what a
    request id remembers; "" for a body without one). Scoring in the API process needs only `request`, and only
    after the task is queued."""

    def __init__(self, body: bytes, npy: bytes, request_id: str | None) -> None:
        self._body, self._npy, self._request_id = body, npy, request_id

    @functools.cached_property
    def pixels(self) -> bytes:
        return pixels_digest(self._npy)

    @functools.cached_property
    def request(self) -> str:
        if not self._request_id:
            return ""
        return body_digest(self._body[: len(self._body) - len(self._npy)], self.pixels)


def task_signature(key: bytes, task_uuid: str, header: bytes, pixels: bytes) -> str:
    """The MAC of a queued request as the API stored it (its header JSON and `pixels_digest` of its npy): workers
    score a task only when it checks out, so pixels or prompts changed in Redis after enqueue are never scored."""
    message = f"task {task_uuid}\n".encode() + hashlib.sha256(header).digest() + pixels
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def genuine(key: bytes, task_uuid: str, reward: str, stored: bytes) -> bool:
    """True when `stored` is a result this service signed for (task_uuid, reward)."""
    try:
        open_result(key, task_uuid, reward, stored)
    except (ForgedResult, ValueError):
        return False
    return True
