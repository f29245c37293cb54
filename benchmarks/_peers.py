"""What `bench_references.py`'s two sides share: the work of one iteration, the tiny SD3.5-M model folder both load,
the weight-free reward, the phase clock, and the peak-memory child.

The model: sanarl's tiny SD3.5-Medium (`sanarl.models.tiny_sd3.build_sd3_pipeline`, seed 0) with the real SD3
CLIP window of 77 positions (the shipped tiny CLIPs have 16; flow_grpo's and DiffusionNFT's `encode_prompt` pad
CLIP prompts to 77 tokens), saved with `save_pretrained` into a folder that sanarl's
`policy.model_name_or_path` and diffusers' `StableDiffusion3Pipeline.from_pretrained` both read.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

CLIP_WINDOW = 77
"""SD3's CLIP token window (the references hard-code it)."""
PROMPTS = (
    "a red circle",
    "a blue square",
    "a green triangle on the left",
    "two yellow circles",
    "a small purple square",
    "a large orange triangle",
    "a blue circle and a red square",
    "three green squares",
)
"""Prompts in the tiny tokenizer's shapes vocabulary; iteration i uses the first `Work.prompts` of them."""
TARGET_MODULES = (
    "attn.add_k_proj",
    "attn.add_q_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
    "attn.to_k",
    "attn.to_out.0",
    "attn.to_q",
    "attn.to_v",
)
"""The LoRA targets of both references' SD3 scripts and of sanarl's sd35m presets."""
MAX_SEQUENCE_LENGTH = 128
"""T5 tokens: the references' scripts pass 128; sanarl's sd35m presets set max_prompt_length = 128."""


@dataclass(frozen=True)
class Work:
    """One iteration's work, the same on both sides of a pair.

    `prompts` groups of `group` samples each, `steps` sampling steps at `size` px, sampled `batch` at a time,
    trained in micro-batches of `micro` samples, `updates` optimizer steps per rollout; `window` stochastic steps
    (Flow-GRPO-Fast's SDE window, starting at step 0; NFT trains int(steps x 0.99) levels); LoRA `rank`
    (alpha = 2 x rank, gaussian init)."""

    prompts: int = 2
    group: int = 4
    steps: int = 6
    size: int = 64
    batch: int = 4
    micro: int = 4
    updates: int = 2
    window: int = 2
    rank: int = 32
    guidance: float = 4.5
    noise_level: float = 0.7

    @property
    def samples(self) -> int:
        return self.prompts * self.group

    def prompt_list(self) -> list[str]:
        return [PROMPTS[i % len(PROMPTS)] for i in range(self.prompts)]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> Work:
        return Work(**json.loads(text))


def save_model(folder: Path) -> Path:
    """The tiny SD3.5-M pipeline with 77-position CLIPs, saved as a diffusers folder (once per folder)."""
    if (folder / "model_index.json").exists():
        return folder
    from transformers import CLIPTextModelWithProjection

    from sanarl.models.tiny_sd3 import build_sd3_pipeline

    pipe = build_sd3_pipeline(0)
    for name in ("text_encoder", "text_encoder_2"):
        old = getattr(pipe, name)
        cfg = old.config
        cfg.max_position_embeddings = CLIP_WINDOW
        torch.manual_seed(1)
        new = CLIPTextModelWithProjection(cfg)
        state = old.state_dict()
        key = "text_model.embeddings.position_embedding.weight"
        table = new.state_dict()[key].clone()
        table[: state[key].shape[0]] = state[key]  # the shipped 16 positions, then fresh rows up to 77
        state[key] = table
        state.pop("text_model.embeddings.position_ids", None)
        new.load_state_dict(state, strict=False)
        setattr(pipe, name, new)
    for name in ("tokenizer", "tokenizer_2"):
        getattr(pipe, name).model_max_length = CLIP_WINDOW
    folder.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(folder)
    return folder


class PhaseClock:
    """CPU seconds per phase of one iteration (the process's CPU time, all threads: on a shared box the wall clock
    mostly measures the wait for a core, which neither side controls). `reward`: the CPU time of the threads
    making reward calls, inside the calls; `rollout`: the process's CPU time from the first sample to the last
    reward collected, minus the reward time; `training`: the rest of the iteration (advantages, batches, forwards,
    backwards, optimizer, EMA, old-policy copy); `whole`: the iteration; `wall`: the iteration's wall-clock time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reward = 0.0
        self.rollout_cpu = 0.0

    def timed_reward(self, fn: Callable) -> Callable:
        def wrapped(*args, **kwargs):
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self.reward += time.thread_time() - t0

        return wrapped

    def timed_rollout(self, fn: Callable) -> Callable:
        """`fn` (a whole rollout: sampling and scoring) with its process CPU time added to the rollout phase."""

        def wrapped(*args, **kwargs):
            t0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.rollout_cpu += time.process_time() - t0

        return wrapped

    def iteration(self, fn: Callable[[], object]) -> dict[str, float]:
        """Run one iteration `fn` and return its phases."""
        self.reward = self.rollout_cpu = 0.0
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {
            "rollout": max(self.rollout_cpu - self.reward, 0.0),
            "reward": self.reward,
            "training": max(cpu - self.rollout_cpu, 0.0),
            "whole": cpu,
            "wall": wall,
        }


class Side:
    """One contender of a pair: built once, then `iteration()` runs one whole iteration and returns its phases.
    `patched`: the lines of the reference's copy patched for the CPU (empty for sanarl)."""

    name: str
    patched: list[str]

    def iteration(self) -> dict[str, float]:
        raise NotImplementedError


@contextlib.contextmanager
def own_gradient_state(held: dict[str, Any]) -> Iterator[None]:
    """Run the body on accelerate's gradient-accumulation state `held` (empty: a fresh one), then put back the state
    from before the body; `held` keeps what the body made of it.

    accelerate keeps that state once per process (`GradientState`, shared by every Accelerator): the accumulation
    `num_steps` by which each Accelerator's `backward` divides the loss, set by the Accelerator built last, and
    `sync_gradients`, without which a prepared optimizer skips its step. Two sides in one process that each build
    an Accelerator (sanarl's Runner; flow_grpo's with `gradient_accumulation_steps x window`; Flow-Factory's
    trainer) would otherwise run on the state of the one built last."""
    from accelerate.state import GradientState

    shared = GradientState._shared_state
    before = dict(shared)
    shared.clear()
    shared.update(held)
    try:
        yield
    finally:
        held.clear()
        held.update(shared)
        shared.clear()
        shared.update(before)


class Isolated(Side):
    """A side built and run on its own accelerate gradient state (`own_gradient_state`), whatever the other
    sides built in this process set."""

    def __init__(self, build: Callable[[], Side]) -> None:
        self._state: dict[str, Any] = {}
        with own_gradient_state(self._state):
            self.side = build()
        self.name, self.patched = self.side.name, self.side.patched

    def iteration(self) -> dict[str, float]:
        with own_gradient_state(self._state):
            return self.side.iteration()


def frozen_sd3_pipeline(model: Path) -> Any:
    """The shared tiny SD3.5-M folder as a reference loads it: every part frozen, no progress bar."""
    from diffusers import StableDiffusion3Pipeline

    pipe = StableDiffusion3Pipeline.from_pretrained(model)
    for part in (pipe.vae, pipe.text_encoder, pipe.text_encoder_2, pipe.text_encoder_3, pipe.transformer):
        part.requires_grad_(False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def reference_lora_config(rank: int) -> Any:
    """The references' LoRA: rank `rank`, alpha 2 x rank, gaussian init, the 8 attention projections."""
    from peft import LoraConfig

    return LoraConfig(
        r=rank, lora_alpha=2 * rank, init_lora_weights="gaussian", target_modules=list(TARGET_MODULES)
    )


class ReferenceSd3Side(Side):
    """What both SD3 reference loops (flow_grpo, DiffusionNFT: both packages are named `flow_grpo`) do alike:
    encode prompts with their `encode_prompt`, repeat each prompt `group` times in sampling batches, and time the
    rollout. A subclass sets `pipe`, `m` (the reference's imported modules), `work`, `clock` and `_sample`."""

    pipe: Any
    m: dict[str, Any]
    work: Work
    clock: PhaseClock

    def _embed(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        encoders = [self.pipe.text_encoder, self.pipe.text_encoder_2, self.pipe.text_encoder_3]
        tokenizers = [self.pipe.tokenizer, self.pipe.tokenizer_2, self.pipe.tokenizer_3]
        with torch.no_grad():
            return self.m["diffusers_patch.train_dreambooth_lora_sd3"].encode_prompt(
                encoders, tokenizers, prompts, MAX_SEQUENCE_LENGTH
            )

    def _prompt_batches(self) -> list[list[str]]:
        rows = [p for p in self.work.prompt_list() for _ in range(self.work.group)]
        return [rows[i : i + self.work.batch] for i in range(0, len(rows), self.work.batch)]

    def _timed_sample(self) -> list[dict]:
        return self.clock.timed_rollout(self._sample)()


# --- peak memory: a fresh child per side (the method of scripts/measure_capacity.py) ---------------------------------
def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def measure_child(side: Side) -> dict:
    """In the child: one warm-up iteration (imports, kernels, optimizer state), then the kernel's peak-RSS mark
    reset and one measured iteration; its peak above the resident size before it."""
    side.iteration()
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status("VmRSS")
    side.iteration()
    return {"peak": _status("VmHWM") - base, "base": base}


def peak_memory(argv: list[str]) -> dict:
    """Run `bench_references.py <argv>` (a `--child` call) in a fresh process with glibc's mmap threshold pinned
    at 64 KiB (every tensor of 64 KiB or more its own mapping, returned when freed) and one OpenMP thread."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    script = Path(__file__).with_name("bench_references.py")
    done = subprocess.run(
        [sys.executable, str(script), *argv], env=env, capture_output=True, text=True, check=False
    )
    for line in done.stdout.splitlines():
        if line.startswith("MEASURED "):
            return json.loads(line[len("MEASURED ") :])
    raise RuntimeError(f"memory child {' '.join(argv)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
