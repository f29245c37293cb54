"""Reward service pieces that need no Redis: the wire-format parser (with a fuzz test), the config file, batched
scoring, and the CLI's bad-input exits. Oracles are hand-built bodies and in-process reward calls."""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import redis
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir
from service_helpers import require_redis

from reward_service import wire_format
from reward_service.batch_scoring import Task, score_tasks
from reward_service.cli import main as cli_main
from reward_service.config import loads_service_config, mask_url, token_bits
from reward_service.embedded_redis import DIR_PREFIX, LOCK_NAME, _lock, remove_stale_dirs
from reward_service.signing import ForgedResult, genuine, open_result, result_key, sign
from reward_service.supervisor import worker_slots
from reward_service.wire_format import PayloadError, decode_array, encode_body, parse_enqueue
from reward_service.worker import REFUSALS_BEFORE_EXIT, RedisRefused, StopFlag, Worker, _hosted
from sanarl.errors import ConfigError
from sanarl.rewards.scorers.jpeg import JpegCompressibility, JpegIncompressibility
from sanarl.rewards.scorers.shapes import ShapesReward
from sanarl.rewards.video import score_video
from sanarl.worlds import shapes as world

pytestmark = pytest.mark.service
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "sanarl-hypothesis")  # not .hypothesis/ in the repo

LIMITS = {"max_images": 8, "max_json_bytes": 4096}


def pixels(count: int, size: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, size, size, 3), dtype=np.uint8)


def good_header(count: int = 2, **extra) -> dict:
    return {"prompts": [f"p{i}" for i in range(count)], "reward_fn": {"jpeg_compressibility": 1.0}, **extra}


def npy(array: np.ndarray, allow_pickle: bool = False) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=allow_pickle)
    return buffer.getvalue()


def refused(body: bytes, known=("jpeg_compressibility",)) -> PayloadError:
    with pytest.raises(PayloadError) as info:
        parse_enqueue(body, known_rewards=known, **LIMITS)
    return info.value


# ------------------------------------------------------------------------------------------------ parser


def test_parse_keeps_pixels_and_forwards_cosmos_rl_metadata():
    images = pixels(2)
    header = good_header(
        metadata=[{"a": 1}, {"a": 2}],
        tag="counting",
        include=[{"class": "circle", "count": 2}],
        request_id="r-1",
    )
    parsed = parse_enqueue(encode_body(header, images), known_rewards=["jpeg_compressibility"], **LIMITS)
    assert parsed.count == 2 and parsed.request_id == "r-1"
    assert parsed.header["shape"] == [2, 8, 8, 3] and parsed.header["media_type"] == "image"
    assert parsed.rewards == {"jpeg_compressibility": 1.0}
    include = [{"class": "circle", "count": 2}]
    assert parsed.header["metadata"] == [
        {"a": 1, "tag": "counting", "include": include},
        {"a": 2, "tag": "counting", "include": include},
    ]
    np.testing.assert_array_equal(decode_array(parsed.npy, parsed.header["shape"]), images)


@pytest.mark.parametrize("layout", ["np.save", "fortran order", "format 2.0"])
def test_the_worker_decodes_every_accepted_npy_as_np_load_does(layout):
    """The worker reads np.save's own layout straight after its header; other accepted npy take np.load."""
    images = np.random.default_rng(5).integers(0, 256, (3, 5, 7, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    if layout == "format 2.0":
        np.lib.format.write_array(buffer, images, version=(2, 0))
    else:
        np.save(
            buffer, np.asfortranarray(images) if layout == "fortran order" else images, allow_pickle=False
        )
    parsed = parse_enqueue(
        json.dumps(good_header(3)).encode() + b"\n" + buffer.getvalue(),
        known_rewards=["jpeg_compressibility"],
        **LIMITS,
    )
    decoded = decode_array(parsed.npy, parsed.header["shape"])
    assert decoded.flags.writeable and decoded.flags.c_contiguous
    np.testing.assert_array_equal(decoded, np.load(io.BytesIO(parsed.npy), allow_pickle=False))
    np.testing.assert_array_equal(decoded, images)
    with pytest.raises(PayloadError, match="expected uint8"):
        decode_array(parsed.npy, [3, 5, 7, 4])


def test_parse_single_prompt_shared_metadata_and_video():
    video = np.zeros((2, 3, 4, 8, 8), dtype=np.uint8)
    header = {
        "prompt": "one",
        "reward_fn": {"shapes": 2},
        "metadata": {"k": "v"},
        "video_infos": [{"fps": 8}, {"fps": 16}],
    }
    parsed = parse_enqueue(encode_body(header, video), known_rewards=None, **LIMITS)
    assert parsed.header["media_type"] == "video"  # inferred from the rank
    assert parsed.header["prompts"] == ["one", "one"]
    assert parsed.header["metadata"] == [
        {"k": "v", "video_info": {"fps": 8}},
        {"k": "v", "video_info": {"fps": 16}},
    ]
    assert parsed.rewards == {"shapes": 2.0}


@pytest.mark.parametrize(
    ("case", "status", "fragment"),
    [
        ("no_newline", 422, "no newline"),
        ("bad_json", 422, "does not parse"),
        ("json_list", 422, "must be an object"),
        ("truncated", 422, "truncated"),
        ("trailing", 422, "extra bytes"),
        ("pickle", 422, "never unpickles"),
        ("float32", 422, "dtype float32"),
        ("ndim3", 422, "[B, H, W, 3]"),
        ("zero", 422, "0 images"),
        ("too_many", 413, "max_images"),
        ("prompts", 422, "3 entries but the array holds 2"),
        ("unknown", 422, "unknown reward"),
        ("weight", 422, "finite number"),
        ("latent", 422, "latent"),
        ("request_id", 422, "request_id"),
        ("long_json", 413, "max_json_bytes"),
        ("not_npy", 422, "not a valid .npy"),
        ("frame_key", 422, "unknown keys ['stride']"),
        ("frame_stride", 422, "video_frame_stride` must be an integer >= 1, got 0"),
        ("frame_reduction", 422, "must be one of ['mean', 'min', 'max', 'median'], got 'sum'"),
    ],
)
def test_parse_refuses_bad_bodies(case, status, fragment):
    images = pixels(2)
    bodies = {
        "no_newline": json.dumps(good_header()).encode(),
        "bad_json": b"{'prompts': 1}\n" + npy(images),
        "json_list": b"[1, 2]\n" + npy(images),
        "truncated": encode_body(good_header(), images)[:-5],
        "trailing": encode_body(good_header(), images) + b"xx",
        "pickle": json.dumps(good_header(1)).encode() + b"\n" + npy(np.array([{"x": 1}], dtype=object), True),
        "float32": encode_body(good_header(), images.astype(np.float32)),
        "ndim3": encode_body(good_header(), images[0]),
        "zero": encode_body(good_header(0), images[:0]),
        "too_many": encode_body(good_header(9), pixels(9)),
        "prompts": encode_body(good_header(3), images),
        "unknown": encode_body({**good_header(), "reward_fn": {"jpeg_compresibility": 1.0}}, images),
        "weight": encode_body({**good_header(), "reward_fn": {"jpeg_compressibility": "x"}}, images),
        "latent": encode_body(good_header(media_type="latent"), images),
        "request_id": encode_body(good_header(request_id="a b"), images),
        "long_json": b"{" + b" " * 5000 + b"}\n" + npy(images),
        "not_npy": json.dumps(good_header()).encode() + b"\nNOTNUMPY" + bytes(40),
        "frame_key": encode_body(
            {**good_header(), "reward_fn": {"jpeg_compressibility": {"stride": 2}}}, images
        ),
        "frame_stride": encode_body(
            {**good_header(), "reward_fn": {"jpeg_compressibility": {"video_frame_stride": 0}}}, images
        ),
        "frame_reduction": encode_body(
            {**good_header(), "reward_fn": {"jpeg_compressibility": {"video_frame_reduction": "sum"}}}, images
        ),
    }
    error = refused(bodies[case])
    assert error.status == status
    assert fragment in str(error)


def test_parse_reward_fn_objects_carry_weights_and_video_frame_options():
    """Cosmos-RL's `{name: weight}` and sanarl's `{name: {weight, video_frame_*}}` mix; frame options are kept for
    videos only (images have no frames to pick)."""
    video = np.zeros((1, 3, 4, 8, 8), dtype=np.uint8)
    fns = {
        "jpeg_compressibility": {"weight": 0.5, "video_frame_stride": 2, "video_frame_reduction": "median"},
        "shapes": 3,
        "clipscore": {"video_frame_reduction": "max"},
    }
    header = {"prompts": ["v"], "reward_fn": fns}
    parsed = parse_enqueue(encode_body(header, video), known_rewards=None, **LIMITS)
    assert parsed.rewards == {"jpeg_compressibility": 0.5, "shapes": 3.0, "clipscore": 1.0}
    assert parsed.header["frames"] == {
        "jpeg_compressibility": {"video_frame_stride": 2, "video_frame_reduction": "median"},
        "clipscore": {"video_frame_reduction": "max"},
    }
    image = parse_enqueue(
        encode_body({"prompts": ["i"], "reward_fn": fns}, pixels(1)), known_rewards=None, **LIMITS
    )
    assert "frames" not in image.header and image.rewards["jpeg_compressibility"] == 0.5


def test_parse_reads_npy_header_only_and_never_loads_objects():
    """An object array is refused from its header: np.load never runs on client bytes on the server."""
    body = json.dumps(good_header(1)).encode() + b"\n" + npy(np.array([object()], dtype=object), True)
    error = refused(body)
    assert "pickle" in str(error) and error.status == 422


@pytest.mark.parametrize("shape", [(1, 1, 1, 3), (8, 64, 64, 3), (24, 64, 64, 3), (2, 3, 4, 8, 8), (3,)])
def test_npy_headers_np_save_writes_parse_as_numpy_reads_them(shape):
    """The header np.save writes is read without numpy's parser; the shape is the one np.load reads, and any other
    header numpy accepts (other key order, spacing, format 2.0) still parses through numpy's own reader."""
    array = np.zeros(shape, np.uint8)
    saved = npy(array)
    assert wire_format._saved_shape(saved) == np.load(io.BytesIO(saved)).shape == shape
    text = f"{{'shape': {shape}, 'fortran_order': False,  'descr': '|u1'}}"
    padded = text + " " * (-(len(text) + 11) % 64) + "\n"
    for version in (b"\x01\x00", b"\x02\x00"):
        size = len(padded).to_bytes(2 if version == b"\x01\x00" else 4, "little")
        other = b"\x93NUMPY" + version + size + padded.encode() + array.tobytes()
        assert np.load(io.BytesIO(other)).shape == shape and wire_format._saved_shape(other) is None
        body = json.dumps(good_header(shape[0])).encode() + b"\n" + other
        if len(shape) in (4, 5) and (len(shape) == 5 or shape[3] == 3) and shape[0] <= LIMITS["max_images"]:
            assert parse_enqueue(body, known_rewards=None, **LIMITS).header["shape"] == list(shape)
    tampered = saved.replace(b"'|u1'", b"'<u2'", 1)  # same length, another dtype: never the fast path
    assert wire_format._saved_shape(tampered) is None


SEED_BODY = encode_body(good_header(2, metadata=[{"x": 1}, {"y": [1, 2]}]), pixels(2, 4))


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.binary(max_size=400),
        st.tuples(st.integers(0, len(SEED_BODY)), st.binary(max_size=8)).map(
            lambda t: SEED_BODY[: t[0]] + t[1] + SEED_BODY[t[0] + len(t[1]) :]
        ),
        st.integers(0, len(SEED_BODY)).map(lambda n: SEED_BODY[:n]),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=5), st.lists, max_leaves=8
        ).map(lambda v: json.dumps(v).encode() + b"\n" + SEED_BODY.split(b"\n", 1)[1]),
    )
)
def test_fuzzed_bodies_only_raise_payload_errors(data):
    """Whatever the bytes, the parser accepts them or raises PayloadError (413 / 422), never anything else."""
    try:
        parsed = parse_enqueue(data, known_rewards=["jpeg_compressibility"], **LIMITS)
    except PayloadError as exc:
        assert exc.status in (413, 422)
    else:
        assert decode_array(parsed.npy, parsed.header["shape"]).shape[0] == parsed.count


# ------------------------------------------------------------------------------------------------ config

TOKEN = "unit-test-token-0123456789"
BASE = f'token = "{TOKEN}"\n[[reward_args]]\nreward_type = "jpeg_compressibility"\n'


def test_config_defaults_and_reward_options():
    cfg = loads_service_config(
        BASE + '[[reward_args]]\nreward_type = "clipscore"\nmodel_path = "/m"\ndtype = "bf16"\n'
        "options = { batch_size = 4 }\nenable = false\n"
    )
    assert cfg.host == "127.0.0.1" and cfg.workers.count == 1 and cfg.redis.persistence is True
    assert [e.reward_type for e in cfg.enabled_rewards()] == ["jpeg_compressibility"]
    assert cfg.reward_args[1].build_options() == {"batch_size": 4, "model": "/m", "dtype": "bf16"}
    assert cfg.resolved_token() == TOKEN


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (BASE + "[limits]\nmax_pending = 3\n", "Did you mean `limits.max_pending_tasks`?"),
        ("port = 'x'\n" + BASE, "`port` must be int"),
        (BASE + "[workers]\ncount = -1\n", "`workers.count` = -1 must be >= 0"),
        (BASE + '[[reward_args]]\nreward_type = "jpeg_compressibility"\n', "more than once"),
        ('[[reward_args]]\nreward_type = "shapes"\nenable = false\n', "no reward is enabled"),
        (BASE + "[limits]\nresult_ttl_s = 0\n", "`limits.result_ttl_s` = 0.0 must be > 0"),
        (BASE + '[redis]\nfsync = "sometimes"\n', "`redis.fsync`"),
        (BASE + "port = 1 2\n", "not valid TOML"),
        (
            BASE + '[[worker_groups]]\nrewards = ["jpeg_compresibility"]\n',
            "Did you mean 'jpeg_compressibility'?",
        ),
        (BASE + "[[worker_groups]]\nrewards = []\n", "`worker_groups[0].rewards` is empty"),
        (
            BASE + '[[worker_groups]]\nrewards = ["jpeg_compressibility"]\n' * 2,
            "already in worker_groups[0]",
        ),
        (BASE + '[[worker_groups]]\nrewards = ["jpeg_compressibility"]\ncount = -1\n', "count` = -1"),
        (BASE + "video_frame_stride = 0\n", "video_frame_stride` = 0 must be >= 1"),
        (BASE + 'video_frame_reduction = "sum"\n', "mean | min | max | median"),
        (
            'redis_url = "redis://:secret@h:6379/0"\n' + BASE + "[workers]\ninline = true\n",
            "`workers.inline = true` keeps the queue in the API's memory, so `redis_url` = 'redis://:***@h:6379/0'",
        ),
        (
            BASE + '[workers]\ninline = true\n[[worker_groups]]\nrewards = ["jpeg_compressibility"]\n',
            "cannot apply; remove the groups or set inline = false",
        ),
        (BASE + "[workers]\ninline = 1\n", "`workers.inline` must be bool"),
    ],
)
def test_config_errors_name_the_key(text, fragment):
    with pytest.raises(ConfigError) as info:
        loads_service_config(text, source="svc.toml")
    assert fragment in str(info.value) and "svc.toml" in str(info.value)


def test_config_token_from_env_or_error(monkeypatch):
    cfg = loads_service_config(BASE.replace(f'token = "{TOKEN}"\n', ""))
    monkeypatch.setenv("REMOTE_REWARD_TOKEN", "from-env-0123456789")
    assert cfg.resolved_token() == "from-env-0123456789"
    monkeypatch.delenv("REMOTE_REWARD_TOKEN")
    with pytest.raises(ConfigError, match="REMOTE_REWARD_TOKEN"):
        cfg.resolved_token()


def test_worker_groups_split_the_rewards_between_processes():
    """General workers host what no group takes; each group starts its count; `--group` resolves the hosts."""
    text = (
        'token = "t"\n[workers]\ncount = 2\n[[worker_groups]]\nrewards = ["clipscore"]\ncount = 3\n'
        'device = "cuda:1"\nbatch_images = 8\n'
        + "".join(
            f'[[reward_args]]\nreward_type = "{n}"\n' for n in ("shapes", "clipscore", "jpeg_compressibility")
        )
    )
    cfg = loads_service_config(text)
    assert cfg.general_rewards() == ["shapes", "jpeg_compressibility"]
    assert worker_slots(cfg) == ["general", "general", "0", "0", "0"]
    assert _hosted(cfg, "general") == (["shapes", "jpeg_compressibility"], "", 0)
    assert _hosted(cfg, "0") == (["clipscore"], "cuda:1", 8)
    assert _hosted(cfg, "all")[0] == ["shapes", "clipscore", "jpeg_compressibility"]
    with pytest.raises(ConfigError, match="--group '1'"):
        _hosted(cfg, "1")
    everything = text.replace(
        'rewards = ["clipscore"]', 'rewards = ["clipscore", "shapes", "jpeg_compressibility"]'
    )
    assert worker_slots(loads_service_config(everything)) == [
        "0",
        "0",
        "0",
    ]  # no general worker without rewards


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ('[[reward_args]]\nreward_type = "jpeg_compresibility"\n', "Did you mean 'jpeg_compressibility'?"),
        (
            '[[reward_args]]\nreward_type = "shapes"\noptions = { colour = 1 }\n',
            "does not accept the options",
        ),
        ('[redis]\nexecutable = "no-such-redis-server"\n', "apt-get install -y redis-server"),
    ],
)
def test_cli_bad_input_exits_2_with_a_message(tmp_path, capsys, extra, fragment):
    """Nothing is left running: rewards are checked while the (here: zero) workers boot, redis stops again."""
    require_redis()
    path = tmp_path / "rewards.toml"
    path.write_text(BASE + "[workers]\ncount = 0\n" + extra)
    with pytest.raises(SystemExit) as info:
        cli_main(["--config", str(path)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("sanarl-reward: error: ") and fragment in err and "Traceback" not in err


# ------------------------------------------------------------------------------------------------ scoring


def as_float(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array).permute(0, 3, 1, 2).float() / 255.0


def image_task(item: str, array: np.ndarray, metadata=None) -> Task:
    header = {
        "prompts": [f"{item}{i}" for i in range(len(array))],
        "metadata": metadata or [{} for _ in range(len(array))],
        "media_type": "image",
        "shape": list(array.shape),
    }
    return Task(item, header, array)


def test_batched_scoring_equals_one_call_per_task():
    """Tasks of equal size share one call, other sizes get their own; scores match in-process calls exactly."""
    reward = JpegCompressibility()
    a, b, c = pixels(2, 16, 1), pixels(3, 16, 2), pixels(1, 24, 3)
    out = score_tasks(reward, [image_task("a", a), image_task("b", b), image_task("c", c)])
    for item, array in (("a", a), ("b", b), ("c", c)):
        expected = reward.score(as_float(array), ["p"] * len(array))
        result = out[item].result
        assert result["scores"]["jpeg_compressibility"] == expected["jpeg_compressibility"].tolist()
        assert result["scores"]["jpeg_kb"] == expected["jpeg_kb"].tolist()
        assert result["input_info"]["min"] == int(array.min()) and result["input_info"]["max"] == int(
            array.max()
        )
    assert out["a"].result["batch"] == {"tasks": 2, "images": 5} == out["b"].result["batch"]
    assert out["c"].result["batch"] == {"tasks": 1, "images": 1}
    assert out["a"].result["default_key"] == "jpeg_compressibility" and out["a"].result["attempts"] == 1


def test_uint8_rewards_get_the_received_pixels_and_float_rewards_their_decode(monkeypatch):
    """The worker calls `score_uint8` with the pixels as received: jpeg scores them with no float round trip (the
    conversions are disabled here) and equals in-process scoring of `x / 255`; a float reward gets `x / 255`."""
    from sanarl.rewards import base

    class Mean(base.Reward):
        name = "mean"

        def _score(self, images, prompts, metadata):
            assert images.dtype == torch.float32
            return {"mean": images.double().mean(dim=(1, 2, 3))}

    a, b = pixels(2, 16, 8), pixels(3, 16, 9)
    expected = JpegCompressibility().score(as_float(np.concatenate([a, b])), ["p"] * 5)["jpeg_kb"].tolist()
    with monkeypatch.context() as patch:
        for name in ("from_uint8", "to_uint8"):
            patch.setattr(base, name, lambda *args: pytest.fail("a float round trip on the worker"))
        out = score_tasks(JpegCompressibility(), [image_task("a", a), image_task("b", b)])
    assert out["a"].result["scores"]["jpeg_kb"] + out["b"].result["scores"]["jpeg_kb"] == expected
    assert out["a"].result["batch"] == {"tasks": 2, "images": 5} and out["a"].result["duration"] > 0
    result = score_tasks(Mean(), [image_task("a", a)])["a"].result
    assert result["scores"]["mean"] == pytest.approx((a / 255.0).mean(axis=(1, 2, 3)).tolist(), abs=1e-6)


def test_one_bad_task_fails_alone():
    """A task whose metadata the reward rejects fails with the reward's message; the batch's other tasks pass."""
    row = world.list_prompts("train")["single_object"][0]
    good = world.render(row, 32, seed=0)[None]
    out = score_tasks(ShapesReward(), [image_task("good", good, [row]), image_task("bad", good, [{}])])
    assert (
        out["bad"].result is None
        and "reward 'shapes' failed" in out["bad"].error
        and "metadata" in out["bad"].error
    )
    expected = ShapesReward().score(as_float(good), ["good0"], [row])
    assert out["good"].result["scores"]["partial"] == expected["partial"].tolist()
    assert out["good"].result["batch"]["tasks"] == 1  # rescored alone after the batched call failed


def test_video_gets_the_mean_over_its_frames():
    reward = JpegIncompressibility()
    video = np.random.default_rng(4).integers(0, 256, (2, 3, 3, 16, 16), dtype=np.uint8)
    header = {
        "prompts": ["v0", "v1"],
        "metadata": [{}, {}],
        "media_type": "video",
        "shape": list(video.shape),
    }
    out = score_tasks(reward, [Task("v", header, video)])["v"].result
    frames = torch.from_numpy(video).permute(0, 2, 1, 3, 4).reshape(6, 3, 16, 16).float() / 255.0
    per_frame = reward.score(frames, ["p"] * 6)["jpeg_kb"].reshape(2, 3)
    assert out["scores"]["jpeg_kb"] == pytest.approx(per_frame.mean(dim=1).tolist(), rel=1e-6)
    assert out["batch"] == {"tasks": 1, "images": 6}


@pytest.mark.parametrize(("stride", "reduction"), [(1, "mean"), (2, "min"), (3, "max"), (2, "median")])
def test_video_stride_and_reduction_equal_score_video(stride, reduction):
    """Two video tasks with different frame options share one scoring call; each equals `score_video` on its clips
    (hand check for mean: per-frame kB averaged over the picked frames)."""
    reward = JpegIncompressibility()
    a = np.random.default_rng(6).integers(0, 256, (2, 3, 5, 16, 16), dtype=np.uint8)
    b = np.random.default_rng(7).integers(0, 256, (1, 3, 4, 16, 16), dtype=np.uint8)

    def task(item, clips, stride_, reduction_):
        header = {"prompts": ["v"] * len(clips), "metadata": [{}] * len(clips), "media_type": "video"}
        return Task(item, {**header, "shape": list(clips.shape)}, clips, 0, stride_, reduction_)

    out = score_tasks(reward, [task("a", a, stride, reduction), task("b", b, 1, "mean")])
    for item, clips, s_, r_ in (("a", a, stride, reduction), ("b", b, 1, "mean")):
        floats = torch.from_numpy(clips).float() / 255.0
        expected = score_video(reward, floats, ["v"] * len(clips), stride=s_, reduction=r_)
        assert out[item].result["scores"]["jpeg_kb"] == expected["jpeg_kb"].tolist()
        assert out[item].result["frames"]["scored"] == len(range(0, clips.shape[2], s_))
    picked = len(range(0, 5, stride))
    assert out["a"].result["batch"] == {"tasks": 2, "images": 2 * picked + 4}
    if reduction == "mean":
        frames = (
            torch.from_numpy(a[:, :, ::stride]).permute(0, 2, 1, 3, 4).reshape(-1, 3, 16, 16).float() / 255
        )
        per_frame = reward.score(frames, ["v"] * len(frames))["jpeg_kb"].reshape(2, picked)
        assert out["a"].result["scores"]["jpeg_kb"] == pytest.approx(per_frame.mean(1).tolist(), rel=1e-6)


STOP_IN_BACKOFF = """
import os, signal, sys, threading, time
from reward_service.worker import StopFlag
flag = StopFlag()
signal.signal(signal.SIGTERM, lambda *_: flag.set())
end = time.monotonic() + 1.0
def storm():  # SIGTERMs as fast as they come: some land where Event.wait holds its lock
    while time.monotonic() < end:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0)
threading.Thread(target=storm, daemon=True).start()
stops = 0
while time.monotonic() < end:
    stops += flag.wait(0)
    flag._requested = False
print("stopped", stops > 0)
"""


def test_a_sigterm_during_the_back_off_wait_stops_the_worker():
    """The worker's SIGTERM handler runs in the main thread, possibly in the middle of its back-off wait (the
    moment a dying service takes its redis-server along): setting the stop flag there must never block. With
    threading.Event this deadlocked a worker that the service's kill -9 should have stopped (the same script with an
    Event hangs or overflows the stack in every try)."""
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", STOP_IN_BACKOFF], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )  # fmt: skip
    assert run.returncode == 0 and run.stdout.strip() == "stopped True", run.stderr


def _failing_worker(errors: list[Exception]) -> tuple[Worker, list[int]]:
    """A Worker whose every loop step raises the next error of `errors` and stops the loop once they run out."""
    worker = Worker.__new__(Worker)
    worker.stop, worker.parent, worker.id = StopFlag(), 0, "w-test"
    worker.recover_held = lambda: None
    worker.stop.wait = lambda timeout: False  # no back-off sleeps in the test
    calls = [0]

    def step() -> bool:
        calls[0] += 1
        if calls[0] > len(errors):
            worker.stop.set()
            return True
        raise errors[calls[0] - 1]

    worker.step = step
    worker._maybe_reap = lambda: None
    return worker, calls


def test_worker_retries_outages_for_as_long_as_they_last():
    outage = [
        redis.ConnectionError("refused"),
        redis.TimeoutError("slow"),
        redis.exceptions.BusyLoadingError("x"),
    ]
    worker, calls = _failing_worker(outage * 10)
    worker.run()  # returns when the errors run out: nothing raised after 30 transient errors
    assert calls[0] == 31


def test_worker_exits_when_redis_keeps_refusing_its_commands():
    worker, calls = _failing_worker([redis.AuthenticationError("invalid password")] * 10)
    with pytest.raises(
        RedisRefused, match=r"5 times in a row, last with AuthenticationError.*password and ACL"
    ):
        worker.run()
    assert calls[0] == REFUSALS_BEFORE_EXIT == 5


def test_an_outage_resets_the_refusal_count():
    refused = redis.ResponseError("NOPERM")
    errors = [refused] * 4 + [redis.ConnectionError("down")] + [refused] * 4
    worker, calls = _failing_worker(errors)
    worker.run()
    assert calls[0] == len(errors) + 1


def test_cosmos_rl_reward_keys_become_reward_options():
    """Cosmos-RL's rewards.toml keys for the VLM rewards (dance_grpo's download_path, unified_reward's endpoint)."""
    cfg = loads_service_config(
        BASE
        + '[[reward_args]]\nreward_type = "dance_grpo"\nmodel_path = "/w/VideoReward"\ndownload_path = "/w"\n'
        'dtype = "float16"\n[[reward_args]]\nreward_type = "unified_reward"\nendpoint_url = "http://h:8000/v1"\n'
        'endpoint_api_key = "k"\n'
    )
    assert cfg.reward_args[1].build_options() == {
        "model": "/w/VideoReward",
        "dtype": "float16",
        "download_path": "/w",
    }
    assert cfg.reward_args[2].build_options() == {"endpoint_url": "http://h:8000/v1", "endpoint_api_key": "k"}


def test_video_native_rewards_get_whole_clips_batched_by_clip_shape():
    """`batch_scoring.score_tasks` hands a video-native reward the clips [B, 3, T, H, W] themselves (never frames), one
    call per (T, H, W); frame-wise rewards still see frames."""
    from reward_service.batch_scoring import Task, score_tasks
    from sanarl.rewards.base import Reward

    class ClipMean(Reward):
        name, keys, default_key, video_native = "clip_mean", ("mean",), "mean", True
        calls: list = []

        def check_input(self, images):
            assert images.ndim == 5
            return images

        def _score(self, images, prompts, metadata):
            self.calls.append(tuple(images.shape))
            return {"mean": images.flatten(1).mean(1)}

    rng = np.random.default_rng(0)
    arrays = [
        rng.integers(0, 256, shape, dtype=np.uint8)
        for shape in [(2, 3, 4, 8, 8), (1, 3, 4, 8, 8), (1, 3, 6, 8, 8)]
    ]
    tasks = [
        Task(
            item=f"t{i}",
            header={"prompts": ["p"] * a.shape[0], "metadata": [{}] * a.shape[0], "media_type": "video"},
            array=a,
            stride=2,
        )
        for i, a in enumerate(arrays)
    ]
    reward = ClipMean()
    out = score_tasks(reward, tasks)
    assert sorted(reward.calls) == [(1, 3, 6, 8, 8), (3, 3, 4, 8, 8)]
    for task, array in zip(tasks, arrays, strict=True):
        result = out[task.item].result
        assert result["scores"]["mean"] == pytest.approx(
            (array.reshape(array.shape[0], -1) / 255.0).mean(1).tolist(), abs=1e-6
        )
        assert result["frames"] == {"whole_clip": True, "frames": array.shape[2]}


@pytest.mark.parametrize(
    ("line", "env", "fragment"),
    [
        ('token = "x"\n', None, "`token` in "),
        ("", "short-token", "REMOTE_REWARD_TOKEN (the environment) is 11 character(s) long"),
        ('token = " padded-token-0123456789 "\n', None, "with surrounding spaces"),
    ],
)
def test_a_short_token_exits_2_with_the_rule(tmp_path, capsys, monkeypatch, line, env, fragment):
    """The token guards the API and signs the results: under 16 characters the service refuses to start,
    naming where the token came from, the rule and how to make one."""
    monkeypatch.delenv("REMOTE_REWARD_TOKEN", raising=False)
    if env is not None:
        monkeypatch.setenv("REMOTE_REWARD_TOKEN", env)
    path = tmp_path / "rewards.toml"
    path.write_text(line + '[[reward_args]]\nreward_type = "jpeg_compressibility"\n')
    with pytest.raises(SystemExit) as info:
        cli_main(["--config", str(path)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err and "at least 16 characters" in err and "secrets.token_urlsafe" in err


@pytest.mark.parametrize(
    ("line", "env", "fragment"),
    [
        ('token = "' + "a" * 16 + '"\n', None, "`token` in "),
        ("", "x" * 40, "REMOTE_REWARD_TOKEN (the environment) is too easy to guess"),
        ("", "ab" * 12, "use 2 distinct one(s), about 24 bits"),
    ],
)
def test_a_token_without_entropy_exits_2_with_how_to_make_one(
    tmp_path, capsys, monkeypatch, line, env, fragment
):
    """Length alone is no safeguard: 16 identical characters (or 40, or a repeated pair) carry no secret. The
    service refuses the token at start (exit 2), names where it came from and how to make a random one."""
    monkeypatch.delenv("REMOTE_REWARD_TOKEN", raising=False)
    if env is not None:
        monkeypatch.setenv("REMOTE_REWARD_TOKEN", env)
    path = tmp_path / "rewards.toml"
    path.write_text(line + '[[reward_args]]\nreward_type = "jpeg_compressibility"\n')
    with pytest.raises(SystemExit) as info:
        cli_main(["--config", str(path)])
    assert info.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert fragment in err and "too easy to guess" in err and "at least 64 are required" in err
    assert "secrets.token_urlsafe(32)" in err and "Traceback" not in err


def test_token_bits_estimates_entropy_from_the_characters():
    assert token_bits("a" * 16) == 0.0 and token_bits("") == 0.0
    assert token_bits("ab" * 8) == pytest.approx(16.0)  # one bit a character
    assert token_bits("0123456789abcdef") == pytest.approx(64.0)  # 16 distinct: four bits each
    assert token_bits(TOKEN) > 64  # the tests' token passes


@pytest.mark.parametrize(
    "nested", ["x = " + "[" * 1200 + "]" * 1200, "x = " + "{a=" * 3000 + "1" + "}" * 3000]
)
def test_a_toml_nested_thousands_deep_exits_2_not_a_recursion_error(tmp_path, capsys, monkeypatch, nested):
    monkeypatch.setenv("REMOTE_REWARD_TOKEN", TOKEN)
    path = tmp_path / "deep.toml"
    path.write_text(nested + "\n")
    with pytest.raises(SystemExit) as info:
        cli_main(["--config", str(path)])
    assert info.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{path} nests arrays or tables too deeply" in err and "RecursionError" not in err


def test_mask_url_hides_passwords():
    assert mask_url("redis://:s3cret@10.0.0.5:6380/1") == "redis://:***@10.0.0.5:6380/1"
    assert mask_url("rediss://user:s3cret@host/0") == "rediss://user:***@host/0"
    assert (
        mask_url("redis://host:6379/0?password=s3cret&db=2") == "redis://host:6379/0?password=%2A%2A%2A&db=2"
    )
    assert mask_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_results_are_signed_for_their_task_and_key():
    key = result_key("a-token-of-enough-length")
    stored = sign(key, "u1", "shapes", '{"status": "done", "result": {"scores": [0.5]}}').encode()
    assert open_result(key, "u1", "shapes", stored)["result"]["scores"] == [0.5]
    forged = b"0" * 64 + b'.{"status": "done", "result": {"scores": [999.0]}}'
    for args in (
        (key, "u2", "shapes", stored),  # another task's result
        (key, "u1", "jpeg_compressibility", stored),  # another reward's
        (result_key("another-token-of-length"), "u1", "shapes", stored),
        (key, "u1", "shapes", forged),
        (key, "u1", "shapes", b'{"status": "done", "result": {"scores": [999.0]}}'),
    ):
        assert not genuine(*args)
        with pytest.raises(ForgedResult, match="fails its signature check"):
            open_result(*args)


def test_stale_redis_folders_are_those_whose_lock_nobody_holds(tmp_path):
    """A running service holds its folder's flock (the kernel drops it however the service dies): only folders
    whose lock is free are removed; a folder without a lock file is never touched."""
    live, stale, foreign = (tmp_path / f"{DIR_PREFIX}{n}-x" for n in (1, 2, 3))
    for folder in (live, stale, foreign):
        folder.mkdir()
        (folder / "appendonly.aof").write_text("data")
    held = _lock(live / LOCK_NAME)
    (stale / LOCK_NAME).touch()
    try:
        assert remove_stale_dirs(tmp_path) == [stale]
        assert live.exists() and foreign.exists() and not stale.exists()
    finally:
        os.close(held)
    assert remove_stale_dirs(tmp_path) == [live]
