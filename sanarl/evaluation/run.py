"""`sanarl eval`: generate with each model on the same prompts and seeds, score, write the outputs.

Outputs in `--output DIR`:
- `samples.jsonl`: one object per (model, sample): source, index, prompt, seed, metadata, image (path relative to
  DIR), and every score key;
- `summary.json`: settings, per model `summary.summarize` (per key mean / std / stderr / n; GenEval per-tag and
  overall accuracy for rewards returning strict / partial) and wall time, and with two or more models the paired
  comparison of each against the first;
- `grid.png`: the first prompts, models side by side; `images/<model>/<index>.png`: every sample.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from sanarl.config.schema import Config
from sanarl.core.images import save_grid, to_uint8
from sanarl.errors import UserError
from sanarl.evaluation.generation import generate_and_score
from sanarl.evaluation.prompts import PromptSet
from sanarl.evaluation.sources import ModelSource, load_source, safe_name
from sanarl.models.base import DiffusionAdapter
from sanarl.rewards.held_out import build_rewards
from sanarl.rewards.reward_checks import check_items
from sanarl.rewards.summary import compare, summarize
from sanarl.training.run_folder.folders import make_dir
from sanarl.training.sampling import GenerationSpec

GRID_PROMPTS = 16
"""Prompts shown in grid.png (each with one tile per model)."""


@dataclass
class EvalSettings:
    """Overrides of the configured sampler (None = the config's) and the run's knobs."""

    num_steps: int | None = None
    guidance: float | None = None
    seed: int = 0
    batch_size: int = 16
    stats: bool = False
    device: str = "cpu"


@dataclass
class ModelResult:
    """One model's scores `{key: [N]}`, summary, wall time and the first GRID_PROMPTS images `[k, 3, H, W]`."""

    label: str
    scores: dict[str, list[float]]
    summary: dict[str, Any]
    seconds: float
    preview: torch.Tensor | None = None
    files: list[str] = field(default_factory=list)


def generation_spec(cfg: Config, adapter: DiffusionAdapter, settings: EvalSettings) -> GenerationSpec:
    """The configured evaluation sampler (`eval_num_steps`, guidance, solver, shift, `inference_size`) with the
    `--steps` / `--guidance` overrides."""
    diffusers = cfg.policy.diffusers
    spec = GenerationSpec.from_sample_config(
        diffusers.sample, adapter, diffusers.inference_size, evaluation=True
    )
    if settings.num_steps is not None:
        spec.num_steps = settings.num_steps
    if settings.guidance is not None:
        spec.guidance_scale = settings.guidance
    return spec


def prepare_output(output: str | Path) -> Path:
    """Create `--output` (UserError when it cannot be created or written)."""
    path = make_dir(Path(output).expanduser(), f"--output {output}")
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"`--output {output}` is not writable; choose another directory.")
    return path


def evaluate_source(
    adapter: DiffusionAdapter,
    label: str,
    rows: PromptSet,
    spec: GenerationSpec,
    rewards: dict,
    settings: EvalSettings,
    output: Path | None,
    advance=None,
) -> ModelResult:
    """Generate and score every row with one loaded model; write `images/<label>/<i>.png` when `output` is set."""
    seeds = [settings.seed + i for i in range(len(rows))]
    folder = None if output is None else output / "images" / safe_name(label)
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    preview: list[torch.Tensor] = []
    files: list[str] = []

    def on_batch(start: int, images: torch.Tensor, _scores: dict) -> None:
        have = sum(p.shape[0] for p in preview)
        if have < GRID_PROMPTS:
            preview.append(images[: GRID_PROMPTS - have])
        if folder is not None:
            from PIL import Image

            for j, arr in enumerate(to_uint8(images)):
                path = folder / f"{start + j:05d}.png"
                Image.fromarray(arr).save(path)
                files.append(str(path.relative_to(output)))
        if advance is not None:
            advance(images.shape[0])

    started = time.perf_counter()
    scores = generate_and_score(
        adapter, rows.prompts, rows.metadata, seeds, spec, rewards,
        batch_size=settings.batch_size, stats=settings.stats, on_batch=on_batch,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    summary = summarize(scores, rows.tags())
    return ModelResult(label, scores, summary, seconds, torch.cat(preview) if preview else None, files)


def run_eval(
    sources: list[ModelSource],
    rows: PromptSet,
    reward_names: list[str],
    output: str | Path,
    settings: EvalSettings,
    *,
    spec_config: Config | None = None,
    progress=None,
) -> dict[str, Any]:
    """Evaluate every source on `rows` with one sampler (from `spec_config`, else the first source's config) and
    write samples.jsonl, summary.json, grid.png and the per-image PNGs. Returns the summary dict (also has the
    `ModelResult`s under the private key `_results`)."""
    rewards = build_rewards(reward_names)
    check_items(list(rewards.values()), rows.items(), f"prompts of {rows.source or 'the evaluation'}")
    out = prepare_output(output)
    results: list[ModelResult] = []
    spec: GenerationSpec | None = None
    for source in sources:
        adapter = load_source(source, settings.device)
        spec = spec or generation_spec(spec_config or source.config, adapter, settings)
        advance = progress.start(source.label, len(rows)) if progress is not None else None
        results.append(evaluate_source(adapter, source.label, rows, spec, rewards, settings, out, advance))
        del adapter
    assert spec is not None
    summary = build_summary(sources, rows, list(rewards), spec, settings, results)
    write_samples(out / "samples.jsonl", rows, settings, results)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=_json_default) + "\n")
    write_grid(out / "grid.png", rows, results)
    summary["_results"] = results
    return summary


def _json_default(value: Any) -> Any:
    return str(value)


def build_summary(
    sources: list[ModelSource],
    rows: PromptSet,
    rewards: list[str],
    spec: GenerationSpec,
    settings: EvalSettings,
    results: list[ModelResult],
) -> dict[str, Any]:
    """summary.json's content (see the module docstring)."""
    models = {}
    for src, res in zip(sources, results, strict=True):
        models[res.label] = {
            "kind": src.kind,
            "model": src.config.policy.model_name_or_path,
            "checkpoint": str(src.checkpoint) if src.checkpoint else None,
            "lora": str(src.lora_dir) if src.lora_dir else None,
            "seconds": res.seconds,
            "seconds_per_image": res.seconds / max(1, len(rows)),
            **res.summary,
        }
    first = results[0]
    comparison = {
        res.label: {"reference": first.label, **compare(first.scores, res.scores)} for res in results[1:]
    }
    return {
        "prompts": {"source": rows.source, "n": len(rows)},
        "rewards": rewards,
        "seed": settings.seed,
        "sampler": asdict(spec),
        "models": models,
        "comparison": comparison,
    }


def write_samples(path: Path, rows: PromptSet, settings: EvalSettings, results: list[ModelResult]) -> None:
    """samples.jsonl: one line per (model, sample)."""
    with path.open("w") as fh:
        for res in results:
            for i, prompt in enumerate(rows.prompts):
                record = {
                    "source": res.label,
                    "index": i,
                    "prompt": prompt,
                    "seed": settings.seed + i,
                    "metadata": rows.metadata[i] if rows.metadata else {},
                    "image": res.files[i] if i < len(res.files) else None,
                }
                record.update({key: values[i] for key, values in res.scores.items()})
                fh.write(json.dumps(record, default=_json_default) + "\n")


def write_grid(path: Path, rows: PromptSet, results: list[ModelResult]) -> Path | None:
    """grid.png: for each of the first prompts, one tile per model side by side (caption `model: prompt`)."""
    previews = [r.preview for r in results]
    if any(p is None for p in previews):
        return None
    count = min(p.shape[0] for p in previews)
    tiles, captions = [], []
    for i in range(count):
        for res in results:
            tiles.append(res.preview[i])
            captions.append(f"{res.label}: {rows.prompts[i]}" if len(results) > 1 else rows.prompts[i])
    columns = len(results) * max(1, 8 // len(results))
    return save_grid(torch.stack(tiles), captions, path, columns=columns)
