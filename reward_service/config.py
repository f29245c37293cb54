"""The reward service's configuration: a rewards.toml (the shipped one is package data,
`reward_service/configs/rewards.toml`, named `--config rewards`), one dataclass per table.

Key names follow Cosmos-RL's reward service (`host`, `port`, `[[reward_args]]` with `reward_type`, `enable`,
`model_path`, `dtype`) so its users recognise them; sanarl adds the limits, the worker pool and the embedded
Redis. It is built by the trainer's strict config engine (`sanarl.config.engine`: unknown keys are errors with a
did-you-mean, values have their field's type, choices are `Literal` types), worded as `<file>: <key> ...`; every
error is a `ConfigError` (exit code 2) naming the key and the file. Loading imports neither torch nor any reward:
`build_rewards` (in `rewards_setup.py`) does that.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import sys
import urllib.parse
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any, get_args, get_origin

from sanarl.config.choices import Fsync, LogLevel, VideoReduction
from sanarl.config.engine import Context, Engine, Messages, base_type, is_section, list_item
from sanarl.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

TOKEN_ENV = "REMOTE_REWARD_TOKEN"
"""Environment variable holding the bearer token when the config's `token` is empty (the trainer reads it too)."""
MIN_TOKEN_CHARS = 16
"""Shortest bearer token accepted (a guessable token would open the service and its result signatures)."""
MIN_TOKEN_BITS = 64.0
"""Least entropy of a bearer token, estimated from its own characters (`token_bits`): 16 identical characters
carry none, `secrets.token_urlsafe(32)` about 190 bits."""
MAX_TOML_DEPTH_HINT = 100
"""Nesting the message of a too-deep TOML file suggests staying under (Python's parser recurses per level)."""
REWARD_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
"""Reward names the service accepts (registry names such as `jpeg_compressibility`, `dance_grpo`)."""
VIDEO_REDUCTIONS = get_args(VideoReduction)
"""How per-frame scores of a clip are reduced (`sanarl.rewards.video.REDUCTIONS`)."""


@dataclass
class RedisConfig:
    """`[redis]`: the embedded redis-server started when `redis_url` is empty."""

    port: int = 0
    """Port on 127.0.0.1 (0 = a free port chosen at start)."""
    persistence: bool = True
    """Append-only file on, in a persistent data folder: queued tasks survive a restart of redis-server (the
    service restarts it if it dies) and of the service itself."""
    fsync: Fsync = "everysec"
    """appendfsync policy: always (no loss even on a crash of redis-server, slower) | everysec | no."""
    data_dir: str = ""
    """Folder of the append-only file ("" = `$XDG_STATE_HOME/sanarl/reward-service/redis-<host>-<port>` of the
    API address, ~/.local/state without the variable; a temporary folder removed at exit when persistence is
    off). One service at a time uses a folder."""
    executable: str = "redis-server"
    """The redis-server binary (a name on PATH or a path)."""
    password: str = ""
    """Password the embedded redis-server requires ("" = a random one at each start, handed to the workers in
    their environment). Set it only when other instances or workers must share this Redis: they then use
    `redis_url = "redis://:<password>@127.0.0.1:<port>/0"`."""


@dataclass
class LimitsConfig:
    """`[limits]`: what one request may hold and how long anything lives."""

    max_payload_bytes: int = 256 * 1024 * 1024
    """Largest enqueue body (JSON + npy); larger ones get 413 before they are read."""
    max_json_bytes: int = 4 * 1024 * 1024
    """Largest JSON header of an enqueue body."""
    max_images: int = 1024
    """Most images (or videos) per request."""
    max_pending_tasks: int = 4096
    """Most (request, reward) tasks queued or running at once, over every instance sharing the Redis; enqueue
    answers 429 beyond it (back-pressure instead of dropping work)."""
    max_queue_bytes: int = 4 * 1024**3
    """Enqueue answers 429 while Redis uses more memory than this (pixels of queued requests live there; 0 = no
    limit)."""
    result_ttl_s: float = 3600.0
    """Seconds a result (done or failed) stays pullable."""
    task_deadline_s: float = 900.0
    """A task not scored within this many seconds of its enqueue fails with an error naming the deadline."""
    max_pull_wait_s: float = 30.0
    """Longest server-side wait of one pull that asks for it (form field `wait`, a sanarl extension)."""


@dataclass
class WorkersConfig:
    """`[workers]`: scoring processes started by this instance and the settings every worker shares."""

    count: int = 1
    """General worker processes: each hosts every enabled reward that no `[[worker_groups]]` entry takes (0 = an
    API-only instance when there are no groups either; workers of other instances sharing the Redis do the work)."""
    inline: bool = False
    """Score in the API process itself, on one thread, with no Redis and no worker processes: the fewest hand-offs
    a request can take (the lowest latency on one host). Tasks and results live in the API's memory (a restart loses
    them: a pull then answers 404 and sanarl's client enqueues again); one instance serves alone, so `redis_url`
    and `[[worker_groups]]` are refused with it and `[redis]`, `count`, `visibility_timeout_s`, `max_attempts` and
    `restart_limit` are not used."""
    batch_images: int = 64
    """Most images per scoring call: queued tasks of one reward are batched across requests up to this."""
    visibility_timeout_s: float = 30.0
    """A worker whose heartbeat is this old is dead: its tasks go back to the queue for another worker."""
    max_attempts: int = 3
    """A task whose worker died this many times fails (a task that kills every worker must not loop forever)."""
    torch_threads: int = 0
    """torch.set_num_threads in each worker (0 = torch's default)."""
    restart_limit: int = 5
    """Restarts of crashed workers allowed per minute before the service stops restarting them."""


@dataclass
class WorkerGroup:
    """`[[worker_groups]]`: dedicated worker processes for some rewards, so that a slow reward model does not hold up
    the cheap ones (a worker scores its rewards' batches one after another)."""

    rewards: list[str] = field(default_factory=list)
    """Enabled `reward_type`s these workers host (each reward belongs to at most one group)."""
    count: int = 1
    """Worker processes of this group."""
    device: str = ""
    """Device of the group's reward models ("" = each reward's own `[[reward_args]] device`)."""
    batch_images: int = 0
    """Most images per scoring call in this group (0 = `workers.batch_images`)."""


@dataclass
class RewardArgs:
    """`[[reward_args]]`: one reward served (Cosmos-RL's key names)."""

    reward_type: str = ""
    """Registry name of the reward (`sanarl.rewards.known_rewards()`, or one registered by a plugin)."""
    enable: bool = True
    """Serve this reward."""
    device: str = "cpu"
    """Device of the reward's model (`cuda`, `cuda:1`, `cpu`)."""
    dtype: str = ""
    """Model dtype passed as the reward's `dtype` option ("" = the reward's default)."""
    model_path: str = ""
    """Model directory or Hub id passed as the reward's `model` option ("" = the reward's default)."""
    download_path: str = ""
    """Cosmos-RL's key: the directory holding a reward's base model (passed as its `download_path` option when set;
    `dance_grpo` finds `<download_path>/Qwen2-VL-2B-Instruct` there)."""
    endpoint_url: str = ""
    """Cosmos-RL's key: an OpenAI-compatible endpoint (e.g. `unified_reward` judging through vLLM), passed as the
    reward's `endpoint_url` option when set."""
    endpoint_api_key: str = ""
    """Cosmos-RL's key: the endpoint's bearer key, passed as `endpoint_api_key` when set."""
    options: dict[str, Any] = field(default_factory=dict)
    """Other keyword options of the reward (e.g. `{ batch_size = 16 }`)."""
    video_frame_stride: int = 1
    """Videos: score every N-th frame with this (image) reward, unless the request's `reward_fn` says otherwise."""
    video_frame_reduction: VideoReduction = "mean"
    """Videos: per-frame scores -> one score per clip by mean | min | max | median, unless the request says
    otherwise."""

    def build_options(self) -> dict[str, Any]:
        """The keyword options `build_reward(reward_type, **options)` gets."""
        options = dict(self.options)
        if self.model_path:
            options["model"] = self.model_path
        if self.dtype:
            options["dtype"] = self.dtype
        for key in ("download_path", "endpoint_url", "endpoint_api_key"):
            if getattr(self, key):
                options[key] = getattr(self, key)
        return options


@dataclass
class ServiceConfig:
    """The whole file. `source` is where it was read from (not a key)."""

    host: str = "127.0.0.1"
    """Address the HTTP server binds (0.0.0.0 to serve other machines: then keep the token secret and use TLS in
    front)."""
    port: int = 8080
    """HTTP port."""
    token: str = ""
    """Bearer token clients must send ("" = read REMOTE_REWARD_TOKEN from the environment; one of them is required)."""
    redis_url: str = ""
    """An external Redis (`redis://host:port/db`) shared by several instances; "" = start an embedded one."""
    redis_prefix: str = "sanarl:reward:"
    """Prefix of every Redis key (several services may share one Redis under different prefixes)."""
    plugins: list[str] = field(default_factory=list)
    """Modules or .py files imported before rewards are built (they register rewards with
    `@sanarl.rewards.register`)."""
    log_level: LogLevel = "info"
    """Log level of the service and its workers."""
    redis: RedisConfig = field(default_factory=RedisConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    worker_groups: list[WorkerGroup] = field(default_factory=list)
    reward_args: list[RewardArgs] = field(default_factory=list)
    source: str = field(default="<defaults>", metadata={"internal": True})

    def enabled_rewards(self) -> list[RewardArgs]:
        """The `[[reward_args]]` entries with `enable = true`, in file order."""
        return [entry for entry in self.reward_args if entry.enable]

    def reward_entry(self, name: str) -> RewardArgs:
        """The enabled `[[reward_args]]` entry of reward `name` (KeyError when there is none)."""
        for entry in self.enabled_rewards():
            if entry.reward_type == name:
                return entry
        raise KeyError(name)

    def general_rewards(self) -> list[str]:
        """Enabled rewards no `[[worker_groups]]` entry takes: the general workers (`workers.count`) host these."""
        grouped = {name for group in self.worker_groups for name in group.rewards}
        return [e.reward_type for e in self.enabled_rewards() if e.reward_type not in grouped]

    def resolved_token(self) -> str:
        """The bearer token: `token`, else the REMOTE_REWARD_TOKEN environment variable; ConfigError when there is
        none or it is shorter than MIN_TOKEN_CHARS."""
        token = self.token or os.environ.get(TOKEN_ENV, "")
        if not token:
            raise ConfigError(
                f'{self.source}: no bearer token: set `token = "..."` in the file or export {TOKEN_ENV}; '
                "the service never runs without one (clients send it as `Authorization: Bearer <token>`)."
            )
        if len(token) < MIN_TOKEN_CHARS or token != token.strip():
            where = f"`token` in {self.source}" if self.token else f"{TOKEN_ENV} (the environment)"
            raise ConfigError(
                f"{where} is {len(token)} character(s) long{' with surrounding spaces' if token != token.strip() else ''}"
                f"; the bearer token must be at least {MIN_TOKEN_CHARS} characters without surrounding spaces "
                f"(it also signs the results). Make one with "
                '`python -c "import secrets; print(secrets.token_urlsafe(32))"`.'
            )
        bits = token_bits(token)
        if bits + 1e-9 < MIN_TOKEN_BITS:
            where = f"`token` in {self.source}" if self.token else f"{TOKEN_ENV} (the environment)"
            raise ConfigError(
                f"{where} is too easy to guess: its {len(token)} characters use {len(set(token))} distinct "
                f"one(s), about {bits:.0f} bits of entropy where at least {MIN_TOKEN_BITS:.0f} are required (it "
                "also signs the results). Use a random token, e.g. "
                '`python -c "import secrets; print(secrets.token_urlsafe(32))"`.'
            )
        return token


def token_bits(token: str) -> float:
    """Estimated entropy of `token` in bits: its length times the Shannon entropy of its character frequencies
    (0 for a repeated character; an upper bound for any token made by a person)."""
    n = len(token)
    counts = [token.count(c) for c in set(token)]
    return -n * sum(k / n * math.log2(k / n) for k in counts) if n else 0.0


def mask_url(url: str) -> str:
    """`url` with its password (userinfo or `?password=`) replaced by `***`, for logs and messages."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        user = parts.username or ""
        host = netloc.rpartition("@")[2]
        netloc = f"{user}:***@{host}"
    query = urllib.parse.urlencode(
        [
            (k, "***" if k == "password" else v)
            for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        ]
    )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def shipped_config(name: str) -> Path:
    """The shipped config `reward_service/configs/<name>.toml` (package data)."""
    return Path(str(files("reward_service").joinpath("configs", f"{name.removesuffix('.toml')}.toml")))


def resolve_config_path(path: str | Path) -> Path:
    """The absolute path of a `--config` argument: an existing file, else the shipped config of that name
    (`rewards` -> reward_service/configs/rewards.toml) when the argument has no directory part. The service and
    its workers both go through this, and the service hands its result to the workers, so a shorthand means
    the same file whatever their working directory."""
    path = Path(path).expanduser()
    if not path.is_file() and path.parent == Path(".") and shipped_config(path.name).is_file():
        path = shipped_config(path.name)
    return path.absolute()


def load_service_config(path: str | Path) -> ServiceConfig:
    """Read and check a rewards.toml (a path, or the name of a shipped config: `rewards`); raises ConfigError
    naming the file and key."""
    path = resolve_config_path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the reward service config {str(path)!r} ({exc.strerror}); pass an existing file, e.g. "
            f"`sanarl-reward --config rewards` (the shipped {shipped_config('rewards')})."
        ) from None
    return loads_service_config(text, source=str(path))


def loads_service_config(text: str, source: str = "<string>") -> ServiceConfig:
    """Parse a rewards.toml given as text (see `load_service_config`)."""
    ctx = Context(where=source)
    try:
        config = ENGINE.build(ENGINE.parse_toml(text, source), ctx)
    except RecursionError:
        raise ConfigError(
            f"{source} nests arrays or tables too deeply for the TOML parser (Python's recursion limit); a "
            f"rewards.toml needs a few levels: flatten it (keep nesting under {MAX_TOML_DEPTH_HINT} levels)."
        ) from None
    config.source = source
    _check(config)
    return config


def _kind(value: Any) -> str:
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), f"a {type(value).__name__}"
    )


class _Messages(Messages):
    """The reward service's wording of the engine's errors: `<file>: <key> must be ...`."""

    def malformed_toml(self, where: str, err: tomllib.TOMLDecodeError, text: str) -> ConfigError:
        return ConfigError(f"{where} is not valid TOML: {err}. Fix the syntax at that line.")

    def unknown_key(
        self, key: str, path: str, names: list[str], root: type, where: str, more: list[str]
    ) -> ConfigError:
        prefix = f"{path}." if path else ""
        close = difflib.get_close_matches(key, names, n=1)
        hint = f" Did you mean `{prefix}{close[0]}`?" if close else ""
        return ConfigError(
            f"{where}: unknown key `{prefix}{key}` in {path or 'the top level'}.{hint} Valid keys: {', '.join(names)}."
        )

    def wrong_type(self, key: str, tp: Any, value: Any, where: str, override: bool = False) -> ConfigError:
        if is_section(tp):
            return ConfigError(f"{where}: `{key or 'the top level'}` must be a table, got {_kind(value)}.")
        if list_item(tp) is not None:
            return ConfigError(f"{where}: `{key}` must be an array, got {_kind(value)}.")
        if get_origin(tp) is dict:
            return ConfigError(
                f"{where}: `{key}` must be a table (e.g. `{{ batch_size = 16 }}`), got {_kind(value)}."
            )
        return ConfigError(
            f"{where}: `{key}` must be {base_type(tp).__name__}, got {_kind(value)} {value!r}."
        )

    def bad_choice(self, key: str, value: Any, allowed: tuple[Any, ...], where: str) -> ConfigError:
        return ConfigError(f"{where}: `{key}` = {value!r} must be one of {' | '.join(map(str, allowed))}.")


ENGINE = Engine(ServiceConfig, messages=_Messages(), unknown_first=True)
"""The config engine of the trainer (`sanarl.config.engine`) on this file's schema, with the service's wording."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _check(cfg: ServiceConfig) -> None:
    """Cross-field checks: ranges, names, at least one enabled reward (the engine checked the choices)."""
    src = cfg.source
    _require(0 < cfg.port < 65536, f"{src}: `port` = {cfg.port} must be in 1..65535.")
    _require(0 <= cfg.redis.port < 65536, f"{src}: `redis.port` = {cfg.redis.port} must be in 0..65535.")
    _require(bool(cfg.redis_prefix), f'{src}: `redis_prefix` must not be empty (e.g. "sanarl:reward:").')
    _check_limits(cfg.limits, src)
    w = cfg.workers
    for key, value, low in (
        ("workers.count", w.count, 0),
        ("workers.batch_images", w.batch_images, 1),
        ("workers.max_attempts", w.max_attempts, 1),
        ("workers.torch_threads", w.torch_threads, 0),
        ("workers.restart_limit", w.restart_limit, 0),
    ):
        _require(value >= low, f"{src}: `{key}` = {value} must be >= {low}.")
    _require(w.visibility_timeout_s > 0, f"{src}: `workers.visibility_timeout_s` must be > 0.")
    _check_reward_args(cfg)
    _check_groups(cfg)
    _check_inline(cfg)


def _check_limits(limits: LimitsConfig, src: str) -> None:
    for key in ("max_payload_bytes", "max_json_bytes", "max_images", "max_pending_tasks"):
        value = getattr(limits, key)
        _require(value >= 1, f"{src}: `limits.{key}` = {value} must be >= 1.")
    for key in ("result_ttl_s", "task_deadline_s"):
        value = getattr(limits, key)
        _require(value > 0, f"{src}: `limits.{key}` = {value} must be > 0 seconds.")
    _require(limits.max_pull_wait_s >= 0, f"{src}: `limits.max_pull_wait_s` must be >= 0.")
    _require(limits.max_queue_bytes >= 0, f"{src}: `limits.max_queue_bytes` must be >= 0 (0 = no limit).")


def _check_reward_args(cfg: ServiceConfig) -> None:
    src = cfg.source
    names = []
    for i, entry in enumerate(cfg.reward_args):
        _require(
            bool(REWARD_NAME.fullmatch(entry.reward_type)),
            f"{src}: `reward_args[{i}].reward_type` = {entry.reward_type!r} must be a reward name (letters, digits, "
            '`_`, `.`, `-`; e.g. "jpeg_compressibility").',
        )
        _require(
            entry.video_frame_stride >= 1,
            f"{src}: `reward_args[{i}].video_frame_stride` = {entry.video_frame_stride} must be >= 1.",
        )
        names.append(entry.reward_type)
    dupes = sorted({n for n in names if names.count(n) > 1})
    _require(not dupes, f"{src}: `reward_args` lists {dupes} more than once; keep one entry per reward.")
    _require(
        bool(cfg.enabled_rewards()),
        f'{src}: no reward is enabled: add a [[reward_args]] table with reward_type = "..." and enable = true.',
    )


def _check_inline(cfg: ServiceConfig) -> None:
    """`workers.inline` scores in the API process: nothing shares its queue, no process group exists."""
    if not cfg.workers.inline:
        return
    src = cfg.source
    _require(
        not cfg.redis_url,
        f"{src}: `workers.inline = true` keeps the queue in the API's memory, so `redis_url` = "
        f"{mask_url(cfg.redis_url)!r} would not be used; remove one of the two (a shared Redis needs worker processes).",
    )
    _require(
        not cfg.worker_groups,
        f"{src}: `workers.inline = true` scores every reward in the API process, so `[[worker_groups]]` (dedicated "
        "worker processes) cannot apply; remove the groups or set inline = false.",
    )


def _check_groups(cfg: ServiceConfig) -> None:
    """Each group names enabled rewards, none twice; counts and batch sizes are in range."""
    src, enabled = cfg.source, [e.reward_type for e in cfg.enabled_rewards()]
    seen: dict[str, int] = {}
    for i, group in enumerate(cfg.worker_groups):
        key = f"{src}: `worker_groups[{i}]"
        _require(
            bool(group.rewards), f'{key}.rewards` is empty; list the rewards it hosts, e.g. ["pickscore"].'
        )
        _require(group.count >= 0, f"{key}.count` = {group.count} must be >= 0.")
        _require(group.batch_images >= 0, f"{key}.batch_images` = {group.batch_images} must be >= 0.")
        for name in group.rewards:
            if name not in enabled:
                close = difflib.get_close_matches(name, enabled, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ConfigError(
                    f"{key}.rewards` names {name!r}, which is not an enabled [[reward_args]] entry "
                    f"({enabled}).{hint} Enable it or fix the name."
                )
            _require(
                name not in seen,
                f"{key}.rewards` lists {name!r}, already in worker_groups[{seen.get(name)}]; a reward belongs to one "
                "group.",
            )
            seen[name] = i
