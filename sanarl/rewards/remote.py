"""Scoring through the reward service (`sanarl-reward`, docs/reward-service.md): the trainer-side client.

    fn = RemoteRewardFunction(cfg.train.train_policy.remote_reward)   # reads REMOTE_REWARD_* from the environment
    task = fn.submit(images, prompts, metadata)   # enqueues at once, returns a handle (rollout continues)
    result = task.result()                        # RewardResult, as RewardFunction returns it
    result = fn(images, prompts, metadata)        # both in one call

Environment: `REMOTE_REWARD_TOKEN` (bearer token), `REMOTE_REWARD_ENQUEUE_URL` (`http://host:port/api/reward/
enqueue`), `REMOTE_REWARD_FETCH_URL` (`.../api/reward/pull`), as Cosmos-RL's trainer reads them.

Images `[B, 3, H, W]` in [0, 1] travel as uint8 `round(255 x)` `[B, H, W, 3]` in the Cosmos-RL body (JSON + newline
+ npy written without pickle), with a fresh `request_id` so that a retried enqueue is not scored twice. Video clips
`[B, 3, T, H, W]` travel as uint8 `[B, 3, T, H, W]` (media_type "video"); each `reward_fn` value then carries the
run's `video_frame_stride` / `video_frame_reduction`, so the service scores frames as `score_video` does here.
Pulls ask the server to wait for the result (`wait`, a sanarl extension Cosmos-RL's server ignores) and poll until
done or the deadline.

Outages: enqueue and pull retry connection errors, 429 and 5xx with exponential backoff (at most `MAX_BACKOFF_S`
between tries, so a restarted service is seen within seconds) until the failures have lasted `outage_s` and
numbered more than `retries`. A task the service no longer knows (404 "unknown": a restart that lost its queue, a
result that expired) is enqueued again from the kept request body with a fresh request id, at most `retries` times
per task, with a logged notice. A failed task, or one of these limits reached, raises `RemoteRewardError` naming
the uuid, the reward and the service's answer (the runner then stops the run with exit code 3).

Combination is the in-process one (sanarl.rewards.combine, docs/algorithms.md, "Advantages and reward
combination"): each entry reads its `score_key` (empty = the key the service reports as the reward's default),
then clip, weight, sum, final clip, scale; samples with non-finite pixels or scores are flagged in `nan_mask`.
"""

from __future__ import annotations

import http.client
import io
import json
import logging
import math
import os
import random
import threading
import time
import urllib.parse
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from sanarl.errors import ConfigError
from sanarl.rewards.base import (
    RewardInputError,
    check_batch,
    check_images,
    known_finite,
    to_uint8,
    to_uint8_hwc,
)
from sanarl.rewards.combine import RewardFailure, RewardResult, Scored, combine_scores
from sanarl.rewards.pool import DEADLINE_KEY, RewardTimeout
from sanarl.rewards.video import frames_as_images

if TYPE_CHECKING:
    from sanarl.config.schema import RemoteRewardConfig

log = logging.getLogger(__name__)

ENV_TOKEN, ENV_ENQUEUE, ENV_FETCH = (
    "REMOTE_REWARD_TOKEN",
    "REMOTE_REWARD_ENQUEUE_URL",
    "REMOTE_REWARD_FETCH_URL",
)
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
"""Enqueue answers worth retrying (the request id makes a retry safe)."""
MAX_BACKOFF_S = 5.0
"""Longest wait between two tries of a failing call (a `Retry-After` the service sends may be longer)."""


class RemoteRewardError(RewardFailure):
    """The service failed a task or refused a request; the message names the uuid and quotes the answer."""


class _UnknownTask(Exception):
    """A pull answered 404 "unknown": the service lost the task (handled by enqueuing it again)."""


class _Outage:
    """A run of consecutive transient failures (connection errors, 429, 5xx) of one call: how many, since when."""

    def __init__(self, url: str, outage_s: float) -> None:
        self.url, self.outage_s = url, outage_s
        self.tries, self.since = 0, 0.0

    def fail(self, answer: _Answer) -> None:
        """Count a failure; the first of a run logs a notice (a service restarting shows up here)."""
        if self.tries == 0:
            self.since = time.monotonic()
            log.warning(
                "the reward service at %s is unavailable (%s); retrying for up to %g s",
                self.url, f"HTTP {answer.status}" if answer.status else answer.text[:200], self.outage_s,
            )  # fmt: skip
        self.tries += 1

    def reset(self) -> None:
        self.tries = 0

    def over(self, retries: int) -> bool:
        """Whether to give up: more than `retries` failures, lasting `outage_s` seconds or more."""
        return self.tries > retries and time.monotonic() - self.since >= self.outage_s


@dataclass(frozen=True)
class _Answer:
    status: int
    body: dict[str, Any]
    text: str
    retry_after: float | None = None


_ENV_HINTS = {
    ENV_TOKEN: "the service's bearer token",
    ENV_ENQUEUE: "e.g. http://HOST:8080/api/reward/enqueue",
    ENV_FETCH: "e.g. http://HOST:8080/api/reward/pull",
}


def _env(name: str, given: str | None) -> str:
    value = given if given is not None else os.environ.get(name, "")
    if not value:
        raise ConfigError(
            f"train.train_policy.use_remote_reward is on but {name} is not set; export it ({_ENV_HINTS[name]}) "
            "or set use_remote_reward = false to score in-process."
        )
    return value


_local = threading.local()
"""Per-thread kept-alive HTTP connections by (scheme, host:port)."""


def _connection(parts: urllib.parse.SplitResult, timeout: float) -> http.client.HTTPConnection:
    pool = _local.__dict__.setdefault("pool", {})
    key = (parts.scheme, parts.netloc)
    if key not in pool:
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        pool[key] = cls(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    connection = pool[key]
    connection.timeout = timeout
    if connection.sock is not None:
        connection.sock.settimeout(timeout)
    return connection


def _drop(parts: urllib.parse.SplitResult) -> None:
    connection = _local.__dict__.get("pool", {}).pop((parts.scheme, parts.netloc), None)
    if connection is not None:
        connection.close()


def _request(url: str, data: bytes, headers: dict[str, str], timeout: float, method: str = "POST") -> _Answer:
    """One HTTP call on this thread's kept-alive connection; status 0 with the error text when the connection
    failed. A reused connection the server closed meanwhile is retried once on a fresh one (every call here is
    safe to repeat: enqueue carries a request id, pull and health only read)."""
    parts = urllib.parse.urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    for attempt in range(2):
        connection = _connection(parts, timeout)
        reused = connection.sock is not None
        try:
            try:
                connection.request(method, target, body=data if method == "POST" else None, headers=headers)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server may have answered early (413) and closed: read that answer below
            response = connection.getresponse()
            text = response.read().decode("utf-8", "replace")
        except (http.client.HTTPException, OSError) as exc:
            _drop(parts)
            if reused and attempt == 0:
                continue
            return _Answer(0, {}, f"{type(exc).__name__}: {exc}")
        if response.will_close:
            _drop(parts)
        break
    try:
        body = json.loads(text) if text else {}
    except json.JSONDecodeError:
        body = {}
    retry = response.getheader("Retry-After")
    seconds = float(retry) if retry and retry.replace(".", "", 1).isdigit() else None
    return _Answer(response.status, body if isinstance(body, dict) else {}, text, seconds)


class RemoteTask:
    """A request enqueued on the service; `result()` pulls every reward's scores and combines them. The request
    body is kept until then, to enqueue it again if the service loses the task."""

    def __init__(
        self, fn: RemoteRewardFunction, uuid: str, batch: int, bad: torch.Tensor, body: bytes
    ) -> None:
        self.fn, self.uuid, self.batch, self.bad, self.body = fn, uuid, batch, bad, body
        self.started = time.monotonic()
        self.enqueues = 1

    def done(self) -> bool:
        """Whether `result()` has been computed (pulling is lazy; see `result`)."""
        return hasattr(self, "_result")

    def result(self) -> RewardResult:
        """Pull every reward (waiting up to the deadline, counted from the latest enqueue) and combine."""
        if not hasattr(self, "_result"):
            answers = {name: self._answer(name) for name in self.fn.names}
            self._result = self.fn._combine(self, answers)
            self.body = b""
        return self._result

    def _answer(self, name: str) -> dict[str, Any]:
        """`name`'s answer; a task the service lost is enqueued again (`fn.retries` times at most)."""
        while True:
            try:
                return self.fn._pull(self, name)
            except _UnknownTask as unknown:
                if self.enqueues > self.fn.retries:
                    raise RemoteRewardError(
                        f"reward service task {self.uuid} ({name}) is unknown to the service after "
                        f"{self.enqueues} enqueues ({unknown}); the service keeps losing its queue: check that its "
                        "embedded Redis keeps its data folder ([redis] persistence) or that its redis_url is stable."
                    ) from None
                self._enqueue_again(name)

    def _enqueue_again(self, name: str) -> None:
        lost = self.uuid
        self.uuid = self.fn._enqueue(with_fresh_request_id(self.body))
        self.started = time.monotonic()
        self.enqueues += 1
        log.warning(
            "reward service task %s (%s) is unknown to the service (restarted without its queue, or the result "
            "expired); enqueued its images again as %s (try %d of %d)",
            lost, name, self.uuid, self.enqueues, self.fn.retries + 1,
        )  # fmt: skip


class RemoteRewardFunction:
    """The rewards of `config` scored by the reward service; same call shape as `RewardFunction`.

    Args:
        config: `train.train_policy.remote_reward` (names, weights, score keys, clips, scale).
        enqueue_url / fetch_url / token: default to the REMOTE_REWARD_* environment variables.
        deadline_s: a task not done this many seconds after its enqueue raises RewardTimeout.
        retries: least retries of a failing enqueue or pull before giving up; also the most times one task is
            enqueued again when the service lost it.
        backoff_s: first retry delay; doubles each retry (with jitter), capped at MAX_BACKOFF_S.
        outage_s: how long transient failures (connection errors, 429, 5xx) are retried before giving up.
        timeout_s: HTTP timeout of one call (a pull's server-side wait is added).
        pull_wait_s: how long one pull asks the server to wait for the result.
        check: ask the service's /health now whether it serves every configured reward.
    """

    def __init__(
        self,
        config: RemoteRewardConfig,
        *,
        enqueue_url: str | None = None,
        fetch_url: str | None = None,
        token: str | None = None,
        deadline_s: float = 600.0,
        retries: int = 5,
        backoff_s: float = 0.5,
        timeout_s: float = 60.0,
        pull_wait_s: float = 10.0,
        outage_s: float = 120.0,
        check: bool = True,
    ) -> None:
        if not config.reward_fns:
            raise ConfigError(
                "no rewards configured: add at least one [[train.train_policy.remote_reward.reward_fns]] table."
            )
        self.config = config
        self.names = tuple(fn.name for fn in config.reward_fns)
        if len(set(self.names)) != len(self.names):
            raise ConfigError(
                f"train.train_policy.remote_reward.reward_fns lists a reward twice: {list(self.names)}."
            )
        self.enqueue_url = _env(ENV_ENQUEUE, enqueue_url)
        self.fetch_url = _env(ENV_FETCH, fetch_url)
        self.token = _env(ENV_TOKEN, token)
        self.deadline_s, self.retries, self.backoff_s = float(deadline_s), int(retries), float(backoff_s)
        self.timeout_s, self.pull_wait_s, self.outage_s = (
            float(timeout_s),
            float(pull_wait_s),
            float(outage_s),
        )
        self.default_keys: dict[str, str] = {}
        if check:
            self.check_service()

    @property
    def health_url(self) -> str:
        """`/health` on the enqueue URL's host."""
        parts = urllib.parse.urlsplit(self.enqueue_url)
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/health", "", ""))

    @property
    def ping_url(self) -> str:
        """`/api/reward/ping` on the enqueue URL's host (the service's token-checked connectivity check)."""
        parts = urllib.parse.urlsplit(self.enqueue_url)
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/api/reward/ping", "", ""))

    def check_token(self) -> None:
        """Ping the service with the token; raise ConfigError when it refuses it (401) or does not answer."""
        body = urllib.parse.urlencode({"info_data": "sanarl preflight"}).encode()
        headers = self._headers("application/x-www-form-urlencoded")
        answer = _request(self.ping_url, body, headers, self.timeout_s)
        if answer.status == 200:
            return
        if answer.status in (401, 403):
            raise ConfigError(
                f"the reward service at {self.ping_url} refuses the token ({answer.status}): set {ENV_TOKEN} to "
                "the token the service was started with (its config's `token`, else its REMOTE_REWARD_TOKEN)."
            )
        raise ConfigError(
            f"the reward service at {self.ping_url} does not answer its ping ({answer.status or answer.text}): "
            f"start it (`sanarl-reward --config ...`) or fix {ENV_ENQUEUE}."
        )

    def _headers(self, content_type: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", "Content-Type": content_type}

    def check_service(self) -> dict[str, Any]:
        """Read /health; raise ConfigError when the service is unreachable or lacks a configured reward."""
        answer = _request(
            self.health_url, b"", self._headers("application/json"), self.timeout_s, method="GET"
        )
        rewards = answer.body.get("rewards")
        if answer.status == 0 or not isinstance(rewards, dict):
            raise ConfigError(
                f"the reward service at {self.health_url} does not answer /health ({answer.status or answer.text}); "
                f"start it (`sanarl-reward --config ...`) or fix {ENV_ENQUEUE}."
            )
        missing = [name for name in self.names if name not in rewards]
        if missing:
            raise ConfigError(
                f"train.train_policy.remote_reward.reward_fns names {missing}, which the reward service at "
                f"{self.health_url} does not serve (it serves {sorted(rewards)}); enable them in its rewards.toml "
                "or fix the names."
            )
        for name in self.names:
            self.default_keys[name] = str(rewards[name].get("default_key", ""))
        idle = [name for name in self.names if not rewards[name].get("workers")]
        if idle:
            log.warning(
                "the reward service at %s has no live worker for %s yet; tasks wait in its queue (up to the "
                "deadline of %g s)",
                self.health_url,
                idle,
                self.deadline_s,
            )
        return answer.body

    def _sleep(self, attempt: int, hint: float | None) -> None:
        delay = min(self.backoff_s * 2 ** min(attempt, 16), MAX_BACKOFF_S) * (0.5 + random.random())
        time.sleep(max(delay, hint or 0.0))

    def submit(
        self,
        images: torch.Tensor,
        prompts: Sequence[str],
        metadata: Sequence[Mapping[str, Any]] | None = None,
    ) -> RemoteTask:
        """Enqueue one batch and return at once with a `RemoteTask`.

        `images` are `[B, 3, H, W]` in [0, 1], or video clips `[B, 3, T, H, W]` (sent with media_type "video";
        the service scores every `video_frame_stride`-th frame and reduces by `video_frame_reduction`)."""
        body, bad = self.request_body(images, prompts, metadata)
        return RemoteTask(self, self._enqueue(body), len(bad), bad, body)

    def request_body(
        self,
        images: torch.Tensor,
        prompts: Sequence[str],
        metadata: Sequence[Mapping[str, Any]] | None = None,
    ) -> tuple[bytes, torch.Tensor]:
        """The enqueue body of one batch (inputs checked as `submit` takes them) and its samples with non-finite
        pixels (`[B]` bool: sent as zeros, their scores become NaN)."""
        label = "+".join(self.names)
        video = isinstance(images, torch.Tensor) and images.ndim == 5
        if video:
            check_images(frames_as_images(images)[0], label)
            images = images.detach()
        else:
            images = check_images(images, label)
        prompt_list, meta = check_batch(images, prompts, metadata, label)
        if known_finite(images):  # check_images found every pixel finite: nothing to read again
            bad = torch.zeros(images.shape[0], dtype=torch.bool)
        else:  # one reduction per sample: finite pixels in [0, 1] always have a finite float32 sum
            bad = ~torch.isfinite(images.flatten(1).sum(dim=1, dtype=torch.float32)).cpu()
        if bool(bad.any()):
            keep = (~bad).to(images.device).view(-1, *[1] * (images.ndim - 1))
            images = torch.where(keep, images, torch.zeros_like(images))
        header = {
            "prompts": prompt_list,
            "reward_fn": self._reward_fn(video),
            "media_type": "video" if video else "image",
            "metadata": meta,
            "request_id": str(uuidlib.uuid4()),
        }
        return encode_request(header, images), bad

    def _reward_fn(self, video: bool) -> dict[str, Any]:
        """`reward_fn` of a request: `{name: weight}` (Cosmos-RL's form); for clips each value is an object with
        the weight and the run's frame stride / reduction, so the service scores frames as in-process."""
        rr = self.config
        if not video:
            return {fn.name: fn.weight for fn in rr.reward_fns}
        frames = {
            "video_frame_stride": rr.video_frame_stride,
            "video_frame_reduction": rr.video_frame_reduction,
        }
        return {fn.name: {"weight": fn.weight, **frames} for fn in rr.reward_fns}

    def _enqueue(self, body: bytes) -> str:
        headers = self._headers("application/octet-stream")
        outage = _Outage(self.enqueue_url, self.outage_s)
        while True:
            answer = _request(self.enqueue_url, body, headers, self.timeout_s)
            if answer.status == 200 and isinstance(answer.body.get("uuid"), str):
                return answer.body["uuid"]
            if answer.status == 401:
                raise ConfigError(
                    f"the reward service refused the token (401 from {self.enqueue_url}); set {ENV_TOKEN} to the "
                    "service's token."
                )
            if answer.status not in RETRY_STATUSES and answer.status != 0:
                raise RemoteRewardError(
                    f"the reward service refused the request ({answer.status} from {self.enqueue_url}): "
                    f"{answer.body.get('error', answer.text[:500])}"
                )
            outage.fail(answer)
            if outage.over(self.retries):
                raise RemoteRewardError(
                    f"enqueue failed {outage.tries} times over {time.monotonic() - outage.since:.0f} s "
                    f"({self.enqueue_url}); last answer: {answer.status or ''} "
                    f"{answer.body.get('error', answer.text[:500])}. Is the service up (GET /health)?"
                )
            self._sleep(outage.tries - 1, answer.retry_after)

    def _pull(self, task: RemoteTask, name: str) -> dict[str, Any]:
        """Poll `name` of `task` until done (200), failed (500), unknown (404: `_UnknownTask`) or past the
        deadline; transient failures are retried as `_enqueue` does."""
        headers = self._headers("application/x-www-form-urlencoded")
        outage, last = _Outage(self.fetch_url, self.outage_s), None
        while True:
            left = task.started + self.deadline_s - time.monotonic()
            if left <= 0:
                raise RewardTimeout(
                    f"reward service task {task.uuid} ({name}) was not done within the deadline of "
                    f"{self.deadline_s:g} s ({DEADLINE_KEY}); last answer: {last}. Check the service's /health."
                )
            wait = min(self.pull_wait_s, left)
            form = urllib.parse.urlencode({"uuid": task.uuid, "type": name, "wait": f"{wait:.3f}"}).encode()
            answer = _request(self.fetch_url, form, headers, self.timeout_s + wait)
            last = f"{answer.status} {answer.body.get('status') or answer.text[:200]}"
            status = answer.body.get("status")
            if answer.status == 200:
                return answer.body
            if answer.status == 404 and status == "unknown":
                raise _UnknownTask(last)
            if answer.status == 500 and status == "failed":
                raise RemoteRewardError(
                    f"reward service task {task.uuid} ({name}) failed: {answer.body.get('error')}"
                )
            if answer.status == 400 and status == "pending":
                outage.reset()
                continue
            if answer.status == 401:
                raise ConfigError(f"the reward service refused the token on pull; set {ENV_TOKEN} correctly.")
            outage.fail(answer)
            if outage.over(self.retries):
                raise RemoteRewardError(
                    f"pulling reward service task {task.uuid} ({name}) failed {outage.tries} times over "
                    f"{time.monotonic() - outage.since:.0f} s; last answer: {answer.status or ''} "
                    f"{answer.body.get('error', answer.text[:300])}"
                )
            self._sleep(outage.tries - 1, answer.retry_after)

    def _combine(self, task: RemoteTask, answers: dict[str, dict[str, Any]]) -> RewardResult:
        """The in-process combination (`combine_scores`) over the pulled scores: each entry reads its score_key,
        else the key the service reports as the reward's default; samples with non-finite pixels are NaN."""
        scored = {}
        for fn in self.config.reward_fns:
            answer = answers[fn.name]
            key = fn.score_key or answer.get("default_key") or self.default_keys.get(fn.name, "")
            seconds = float(answer.get("duration", 0.0) or 0.0)
            scored[fn.name] = Scored(_scores(task, fn.name, answer), key, seconds)
        return combine_scores(
            self.config,
            scored,
            source=f"reward service task {task.uuid}: ",
            unscored=task.bad if bool(task.bad.any()) else None,  # None: no NaN mask to apply
            error=RemoteRewardError,
        )

    def __call__(
        self,
        images: torch.Tensor,
        prompts: Sequence[str],
        metadata: Sequence[Mapping[str, Any]] | None = None,
    ) -> RewardResult:
        """Enqueue and wait: `submit(...).result()`."""
        return self.submit(images, prompts, metadata).result()


def to_uint8_payload(images: torch.Tensor) -> np.ndarray:
    """Pixels as the service takes them: `round(255 x)` clamped to uint8, C-contiguous; images `[B, 3, H, W]`
    become `[B, H, W, 3]` (channels last: `sanarl.rewards.base.to_uint8_hwc`, quantised straight into that
    layout), clips `[B, 3, T, H, W]` keep their layout."""
    if images.ndim == 4:
        return to_uint8_hwc(images)
    return to_uint8(images).contiguous().cpu().numpy()


def encode_request(header: Mapping[str, Any], images: torch.Tensor) -> bytes:
    """The enqueue body `json + b"\\n" + npy` (docs/reward-service.md, "Wire format") of float pixels in [0, 1]: the npy holds
    `to_uint8_payload(images)` in format 1.0 (what `np.save(..., allow_pickle=False)` writes), built with one copy
    of the pixels. Raises RewardInputError when the header is not JSON-serialisable."""
    array = to_uint8_payload(images)
    try:
        text = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise RewardInputError(
            f"reward metadata must be JSON-serialisable to go to the reward service: {exc}."
        ) from None
    npy_header = io.BytesIO()
    np.lib.format.write_array_header_1_0(npy_header, np.lib.format.header_data_from_array_1_0(array))
    return b"".join((text, b"\n", npy_header.getvalue(), memoryview(array).cast("B")))


def with_fresh_request_id(body: bytes) -> bytes:
    """An enqueue body with a new `request_id` in its JSON header (the first line), pixels unchanged: the service
    scores it as a new request even where it still remembers the old id."""
    text, sep, rest = body.partition(b"\n")
    header = json.loads(text)
    header["request_id"] = str(uuidlib.uuid4())
    return json.dumps(header, separators=(",", ":"), allow_nan=False).encode() + sep + rest


def _scores(task: RemoteTask, name: str, answer: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Numeric score lists of one answer as float32 `[B]` tensors (null -> NaN); other keys are skipped."""
    raw = answer.get("scores")
    if not isinstance(raw, dict):
        raise RemoteRewardError(
            f"reward service task {task.uuid} ({name}): the answer has no `scores` object."
        )
    out = {}
    for key, values in raw.items():
        if not isinstance(values, list) or not all(v is None or isinstance(v, int | float) for v in values):
            continue  # e.g. Cosmos-RL's text predictions or nested groups: not usable as a reward
        if len(values) != task.batch:
            raise RemoteRewardError(
                f"reward service task {task.uuid} ({name}): key {key!r} has {len(values)} scores for "
                f"{task.batch} images."
            )
        out[key] = torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float32)
    return out
