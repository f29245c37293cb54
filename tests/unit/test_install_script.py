"""scripts/install_test_deps.sh's choice of torch build, through its `--plan` (the commands it would run): the CPU
builds from PyTorch's CPU index only where no NVIDIA GPU is present and that index answers, pip's configured index
otherwise (a GPU, or no answer: the case on machines without the internet). The checks are faked through
SANARL_GPU / SANARL_CPU_INDEX, and the index probe itself runs against a local server that answers and a port
that refuses."""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CPU_TORCH = f"+ python -m pip install -q -c constraints.txt --index-url {CPU_INDEX} torch torchvision"


def plan(**env: str) -> list[str]:
    environment = {k: v for k, v in os.environ.items() if k not in {"SANARL_GPU", "SANARL_CPU_INDEX"}}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install_test_deps.sh"), "--plan"],
        capture_output=True, text=True, timeout=60, env={**environment, **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize(
    ("gpu", "index", "cpu_builds"),
    [("0", "up", True), ("0", "down", False), ("1", "up", False), ("1", "down", False)],
)
def test_cpu_builds_only_without_a_gpu_and_with_the_index_answering(gpu, index, cpu_builds):
    lines = plan(SANARL_GPU=gpu, SANARL_CPU_INDEX=index)
    assert (CPU_TORCH in lines) is cpu_builds, lines
    rest = [
        "+ python -m pip install -q -c constraints.txt -e .[test,service,rewards,ocr,geneval,vlm]",
        "+ bash scripts/install_imagereward.sh",
    ]
    assert lines[-2:] == rest  # the same install after the torch choice, either way
    if cpu_builds:
        assert lines.index(CPU_TORCH) < lines.index(rest[0])  # torch first: the editable install keeps it


class _TorchPage(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # quiet
        pass


def test_the_index_probe_follows_a_real_answer_and_a_refusal(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "index.html").write_text("<a>torch-2.14.1+cpu</a>")
    handler = functools.partial(_TorchPage, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        answered = plan(SANARL_GPU="0", TORCH_CPU_INDEX=url)
    finally:
        server.shutdown()
    assert f"+ python -m pip install -q -c constraints.txt --index-url {url} torch torchvision" in answered
    refused = plan(SANARL_GPU="0", TORCH_CPU_INDEX="http://127.0.0.1:9/")  # the discard port: nothing listens
    assert not any("--index-url" in line for line in refused), refused
    assert "torch: the pinned pair from pip's configured index" in refused
