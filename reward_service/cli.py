"""`sanarl-reward --config rewards` (the shipped reward_service/configs/rewards.toml, or a path): the asynchronous
reward service.

Starts (in order) the API's listening socket (a port in use stops it here, before any child process), the Redis
it uses (the external `redis_url`, checked, or an embedded redis-server), the worker processes, and the HTTP API
under uvicorn on that socket (with `[workers] inline = true`: no Redis and no workers; the rewards load in this
process, which scores them); SIGINT / SIGTERM stop all of it. Bad input (config, reward names or options, a port
in use, missing redis-server, unreachable Redis) exits with code 2 and a one-paragraph message; `--debug` adds
the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import socket
import sys
import traceback

from sanarl.errors import ConfigError, UserError


class Stopped(Exception):
    """SIGTERM / SIGINT arrived (raised by our handler so that the cleanup in `serve` always runs)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _on_signal(signum: int, frame: object) -> None:
    raise Stopped(signum)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sanarl-reward", description="The sanarl reward service.")
    parser.add_argument(
        "--config",
        required=True,
        help="a rewards.toml path, or `rewards` for the shipped reward_service/configs/rewards.toml",
    )
    parser.add_argument("--host", help="override `host`")
    parser.add_argument("--port", type=int, help="override `port`")
    parser.add_argument("--workers", type=int, help="override `workers.count`")
    parser.add_argument("--debug", action="store_true", help="tracebacks for bad input; debug logging")
    return parser


def _load(args: argparse.Namespace):
    """Load and check the config file with the command-line overrides; returns (config, token)."""
    from reward_service.config import load_service_config

    config = load_service_config(args.config)  # config.source: the resolved file, handed to the workers
    if args.host is not None:
        config.host = args.host
    if args.port is not None:
        config.port = args.port
    if args.workers is not None:
        if args.workers < 0:
            raise ConfigError(f"--workers {args.workers}: the worker count must be >= 0.")
        if config.workers.inline:
            raise ConfigError(
                f"--workers {args.workers}: {config.source} sets `workers.inline = true` (scoring in the API "
                "process, no worker processes); drop --workers or set inline = false."
            )
        config.workers.count = args.workers
    if args.debug:
        config.log_level = "debug"
    return config, config.resolved_token()


def _external_redis(url: str, source: str) -> str:
    import redis

    from reward_service.config import mask_url

    try:
        redis.Redis.from_url(url, socket_connect_timeout=3).ping()
    except (redis.RedisError, ValueError) as exc:
        raise ConfigError(
            f"{source}: cannot reach redis_url = {mask_url(url)!r} ({exc}); start that Redis, fix the URL, or leave "
            "redis_url empty to let the service start its own redis-server."
        ) from None
    return url


def bind_api_socket(host: str, port: int, source: str) -> socket.socket:
    """The API's socket, bound to `host:port` (uvicorn listens on it); ConfigError naming the port when it is in
    use or the address is not this machine's. Bound before Redis and the workers start, so a second service on a
    used port stops at once with nothing to clean up."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ConfigError(
            f"{source}: `host` = {host!r} is not an address this machine can listen on ({exc}); use 127.0.0.1, "
            "0.0.0.0 or one of its own addresses."
        ) from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a just-closed port is usable
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}. Port {port} is taken (another sanarl-reward, "
            f"or another program: `ss -ltnp | grep :{port}` shows it); stop that process or choose a free port "
            f"with `--port` or `port` in {source}."
        ) from None
    return sock


def _start_embedded(embedded) -> str:
    try:
        embedded.start()
    except (RuntimeError, OSError) as exc:
        raise ConfigError(
            f"the embedded redis-server did not start ({exc}); free the port or choose another `[redis] port`, "
            "or set redis_url to a running Redis."
        ) from None
    return embedded.url


SERVICE_MODULES = ("uvicorn", "fastapi", "redis")
"""What the service imports from the `service` extra (sanarl itself installs without them)."""


def require_service_extra() -> None:
    """ConfigError naming `pip install "sanarl[service]"` when a module of the `service` extra is missing."""
    missing = []
    for name in SERVICE_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            missing.append(name)
    if missing:
        raise ConfigError(
            f"the reward service needs the `service` extra ({', '.join(missing)} not installed): "
            'pip install "sanarl[service]" (from a checkout: pip install -c constraints.txt -e ".[service]").'
        )


def serve(args: argparse.Namespace) -> None:
    """Run the service until interrupted. Workers boot while this process checks every reward (names, options),
    so a bad `[[reward_args]]` entry still stops everything with a ConfigError before the API serves."""
    require_service_extra()
    import uvicorn

    from reward_service.app import create_app, serve_hot_paths
    from reward_service.config import mask_url
    from reward_service.embedded_redis import EmbeddedRedis, default_data_dir
    from reward_service.http_protocol import protocol_class
    from reward_service.inline import inline_broker
    from reward_service.rewards_setup import build_rewards
    from reward_service.signing import result_key
    from reward_service.supervisor import Supervisor

    config, token = _load(args)
    # uvicorn re-raises SIGTERM / SIGINT after its graceful shutdown: ours turns it into Stopped, so the
    # cleanup below runs.
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s sanarl-reward %(levelname)s %(message)s"
    )
    listener = bind_api_socket(config.host, config.port, config.source)
    inline = config.workers.inline
    embedded = (
        None
        if config.redis_url or inline
        else EmbeddedRedis(config.redis, default_dir=default_data_dir(config.host, config.port))
    )
    supervisor = scorer = None
    try:
        if inline:  # the rewards load here, so a reward that cannot load stops the service before it serves
            url, scorer = "", inline_broker(config)
            where = "scoring in this process: workers.inline"
        else:
            url = (
                _external_redis(config.redis_url, config.source)
                if embedded is None
                else _start_embedded(embedded)
            )
            supervisor = Supervisor(config.source, config, url, embedded, key=result_key(token)).start()
            build_rewards(config, load=False)
            where = f"redis {mask_url(url)}, {len(supervisor.slots)} worker(s)"
        names = [entry.reward_type for entry in config.enabled_rewards()]
        logging.getLogger("reward_service").info(
            "serving %s on http://%s:%d (%s)", names, config.host, config.port, where
        )
        app = create_app(config, token=token, redis_url=url, scorer=scorer)
        uvicorn_config = uvicorn.Config(
            serve_hot_paths(app),
            host=config.host,
            port=config.port,
            log_level=config.log_level,
            access_log=config.log_level == "debug",
            timeout_keep_alive=30,
            http=protocol_class(),  # a malformed request head gets a JSON 400 naming it
        )
        server = uvicorn.Server(uvicorn_config)
        if supervisor is None:
            _run_server(server, listener, config)
            return
        supervisor.on_fatal = lambda: setattr(server, "should_exit", True)
        if supervisor.fatal is None:
            _run_server(server, listener, config)
        if supervisor.fatal is not None:
            raise ConfigError(supervisor.fatal)
    finally:
        listener.close()
        if supervisor is not None:
            supervisor.stop()
        if embedded is not None:
            embedded.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_server(server, listener: socket.socket, config) -> None:
    """uvicorn on the bound socket; its own start-up failure (it calls sys.exit) becomes a ConfigError, so the
    caller's cleanup stops the workers and Redis and the service exits with code 2."""
    try:
        server.run(sockets=[listener])
    except SystemExit as exc:
        raise ConfigError(
            f"the HTTP server could not start on {config.host}:{config.port} (exit {exc.code}; its log line is "
            f"above); fix `host` / `port` in {config.source} or free the port."
        ) from None


def _exit_now(code: int) -> None:
    """Leave without the interpreter's teardown (seconds with torch loaded); everything was stopped already."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> None:
    """Entry point of `sanarl-reward`."""
    args = _parser().parse_args(argv)
    try:
        serve(args)
    except UserError as exc:
        if args.debug:
            traceback.print_exc()
        sys.stderr.write(f"sanarl-reward: error: {exc}\n")
        raise SystemExit(exc.exit_code) from None
    except Stopped as stop:
        _exit_now(0 if stop.signum == signal.SIGTERM else 130)
    except KeyboardInterrupt:
        _exit_now(130)
    _exit_now(0)


if __name__ == "__main__":
    main()
