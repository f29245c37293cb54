"""`unified_reward`: UnifiedReward's questions and score parsing (malformed answers by hand), in-process greedy
judging on a tiny random Qwen2.5-VL (batch = one by one), and the OpenAI-compatible path against a small local
HTTP server (127.0.0.1, bounded) that answers from the same tiny model."""

from __future__ import annotations

import base64
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch

pytest.importorskip("torchvision")

from sanarl.errors import ConfigError, WeightsError  # noqa: E402
from sanarl.rewards import build_reward  # noqa: E402
from sanarl.rewards.scorers.vlm import tiny, unified  # noqa: E402

PROMPTS = ["a red cat", "a blue house on a hill", "x"]


def images(batch: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.rand(batch, 3, 16, 24, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def judge():
    r = build_reward("unified_reward", model=str(tiny.ensure_tiny_qwen_vl("qwen2_5_vl")), max_new_tokens=6)
    r.setup("cpu")
    return r


class Endpoint:
    """A local OpenAI-compatible /v1/chat/completions answering with `respond(image uint8 HWC, text)`."""

    def __init__(self, respond) -> None:
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.requests.append(body)
                endpoint.headers.append(dict(self.headers))
                if self.path != "/v1/chat/completions":
                    self.send_error(404)
                    return
                content = body["messages"][0]["content"]
                url = next(c["image_url"]["url"] for c in content if c["type"] == "image_url")
                text = next(c["text"] for c in content if c["type"] == "text")
                answer = respond(decode_png(url), text)
                if answer is None:
                    self.send_error(500, "model crashed")
                    return
                data = json.dumps(
                    {"choices": [{"message": {"role": "assistant", "content": answer}}]}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.timeout = 10
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Endpoint:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def decode_png(url: str) -> np.ndarray:
    from PIL import Image

    assert url.startswith("data:image;base64,")
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB"))


# ---------------------------------------------------------------- protocol by hand


def test_score_parsing_takes_the_first_final_score_and_zero_for_malformed_answers():
    cases = {
        "The image is fine.\nFinal Score: 4": 4.0,
        "Final Score:3.5 because ...": 3.5,
        "Final Score: 2.75, later Final Score: 5": 2.75,
        "Final Score: 55": 5.0,  # the pattern is not anchored: its first digit counts, as in Cosmos-RL
        "Final Score: 7": None,  # outside 1-5
        "final score: 4": None,  # case matters
        "Score: 4": None,
        "Final Score: ": None,
        "": None,
    }
    for answer, expected in cases.items():
        assert unified.parse_score(answer) == expected, answer
    got = unified.scores_of(list(cases))
    assert got["unified_reward"].tolist() == pytest.approx([0.8, 0.7, 0.55, 1.0, 0, 0, 0, 0, 0])
    assert got["unified_reward_parsed"].tolist() == [1, 1, 1, 1, 0, 0, 0, 0, 0]
    assert got["unified_reward_raw"].tolist() == [4.0, 3.5, 2.75, 5.0, 0, 0, 0, 0, 0]


def test_questions_carry_the_caption_in_brackets():
    judge = build_reward("unified_reward")
    assert judge.text_of("a cat").startswith("<image>\nYou are given a text caption and a generated image")
    assert judge.text_of("a cat").endswith(
        "assign a score from 1 to 5 after 'Final Score:'.\nYour task is provided as follows:\nText Caption: [a cat]"
    )
    elements = build_reward("unified_reward", question="elements").text_of("a cat")
    assert "'element (type): value'" in elements and elements.endswith("Text Caption: [a cat]")


def test_png_data_url_round_trips_the_pixels():
    image = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    assert np.array_equal(decode_png(unified.png_data_url(image)), image)


# ---------------------------------------------------------------- in-process and endpoint


def test_in_process_batch_equals_one_by_one(judge):
    x = images()
    uint8 = (x * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    questions = [judge.text_of(p) for p in PROMPTS]
    batch = judge.generate(uint8, questions)
    single = [judge.generate(uint8[i : i + 1], questions[i : i + 1])[0] for i in range(3)]
    assert batch == single and all(isinstance(a, str) for a in batch)
    assert torch.equal(judge.score(x, PROMPTS)["unified_reward"], unified.scores_of(batch)["unified_reward"])


def test_in_process_decoding_greedy_or_the_checkpoints_generation_config(judge, monkeypatch):
    """Greedy by default (as the endpoint requests at temperature 0); decoding = "generation_config" leaves the
    sampling settings to the checkpoint's generation config, as a plain transformers `generate` call."""
    calls: list[dict] = []
    original = judge.model.generate

    def recording(**kwargs):
        calls.append({k: v for k, v in kwargs.items() if k in ("do_sample", "max_new_tokens")})
        return original(**kwargs)

    monkeypatch.setattr(judge.model, "generate", recording)
    uint8 = (images(1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    greedy = judge.generate(uint8, [judge.text_of(PROMPTS[0])])
    monkeypatch.setattr(judge, "decoding", "generation_config")
    monkeypatch.setattr(judge.model.generation_config, "do_sample", False)  # tiny checkpoint: greedy too
    assert judge.generate(uint8, [judge.text_of(PROMPTS[0])]) == greedy
    assert calls == [{"max_new_tokens": 6, "do_sample": False}, {"max_new_tokens": 6}]
    with pytest.raises(ConfigError, match="decoding='beam'"):
        build_reward("unified_reward", decoding="beam")


def test_endpoint_answers_equal_in_process_answers(judge):
    x = images()

    def respond(image, text):
        return judge.generate(image[None], [text])[0]

    with Endpoint(respond) as server:
        remote = build_reward(
            "unified_reward", endpoint_url=server.url, endpoint_api_key="k-123", max_concurrency=2
        )
        assert remote.answers(x, PROMPTS) == judge.answers(x, PROMPTS)
        request = server.requests[0]
        assert request["model"] == "UnifiedReward-7b-v1.5" and request["temperature"] == 0
        assert request["stream"] is False
        assert server.headers[0]["Authorization"] == "Bearer k-123"


def test_endpoint_scores_parse_the_served_answers_and_failures_name_the_url():
    canned = {
        "a red cat": "Looks right. Final Score: 4.5",
        "a blue house on a hill": "I cannot judge.",
        "x": None,
    }

    def respond(image, text):
        return next(a for caption, a in canned.items() if f"[{caption}]" in text)

    with Endpoint(respond) as server:
        remote = build_reward("unified_reward", endpoint_url=server.url)
        got = remote.score(images(2), PROMPTS[:2])
        assert got["unified_reward"].tolist() == pytest.approx([0.9, 0.0])
        assert got["unified_reward_parsed"].tolist() == [1.0, 0.0]
        with pytest.raises(RuntimeError, match=server.url.replace(".", r"\.")):
            remote.score(images(1), ["x"])


def test_options_and_missing_weights(network):
    with pytest.raises(ConfigError, match="endpoint_url"):
        build_reward("unified_reward", endpoint_url="localhost:8000")
    with pytest.raises(ConfigError, match="question"):
        build_reward("unified_reward", question="pairwise")
    with pytest.raises(ConfigError, match="max_concurrency"):
        build_reward("unified_reward", max_concurrency=0)
    with pytest.raises(WeightsError, match="hf download CodeGoat24/UnifiedReward-qwen-7b") as info:
        build_reward("unified_reward").setup("cpu")
    assert info.value.exit_code == 2
    assert build_reward("unified_reward", endpoint_url="http://127.0.0.1:9/v1").check_weights() is None
