"""Evaluation: `sanarl eval` (generate, score, summarise, compare) and the primitives the runner and bench reuse.

    from sanarl.evaluation import evaluate_rewards, load_prompts, resolve_checkpoint, run_eval

Modules: `sources` (what to load), `apply_checkpoint` (checkpoint + EMA application), `prompts` (what to generate for),
`generation` (generate + score), `summary` (aggregates, GenEval accuracy, paired deltas), `run` (the command's
outputs), `console` (progress and table), `cli` (the Typer command). Docs: docs/eval.md.

Names are imported lazily, so `sanarl.evaluation.cli` (imported by the CLI at start) pulls in no torch code.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "PromptSet": "prompts",
    "load_prompts": "prompts",
    "EvalSettings": "run",
    "generation_spec": "run",
    "run_eval": "run",
    "build_rewards": "sanarl.rewards.held_out",
    "evaluate_rewards": "generation",
    "generate_and_score": "generation",
    "score_images": "sanarl.rewards.held_out",
    "ModelSource": "sources",
    "load_source": "sources",
    "resolve_checkpoint": "sources",
    "resolve_model": "sources",
    "compare": "sanarl.rewards.summary",
    "describe": "sanarl.rewards.summary",
    "geneval_accuracy": "sanarl.rewards.summary",
    "summarize": "sanarl.rewards.summary",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sanarl.evaluation' has no attribute {name!r}")
    module = _EXPORTS[name]
    return getattr(importlib.import_module(module if "." in module else f"sanarl.evaluation.{module}"), name)
