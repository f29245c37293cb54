"""The five DiffusionNFT rollout families as config overrides on a tiny model, shared by the per-family runs of the
adapter tests (test_flux_adapter.py, test_sd3_adapter.py): M = 4 drafts per prompt, int8 quantized copies with every
eligible layer quantized (the tiny models' layers are all below Sol-RL's min dims), torch.compile replaced by a
recorder (compile itself is covered by test_compile.py: minutes on 2 cores for a whole model)."""

from __future__ import annotations

import torch

INT8 = ["rollout.preview_precision=int8", "rollout.nvfp4_min_dim=0"]
FAMILIES = {
    "diffusionnft": [],
    "naive_scaling": ["rollout.family=naive_scaling", "rollout.num_candidates=4"],
    "compile": ["rollout.family=compile", "rollout.num_candidates=4"],
    "naive_quant": ["rollout.family=naive_quant", "rollout.num_candidates=4", *INT8],
    "sol_rl": ["rollout.family=sol_rl", "rollout.num_candidates=4", "rollout.preview_step=2", *INT8],
}


def record_compiles(monkeypatch) -> list:
    """Replace torch.compile by the identity; returns the list of the modes it was called with."""
    compiled: list = []
    monkeypatch.setattr(torch, "compile", lambda module, mode=None: compiled.append(mode) or module)
    return compiled


def check_family_run(outcome, records: list[dict], compiled: list, prompts: int = 2, k: int = 2) -> None:
    """The run's rollout images, compiled copies and quantized layers are those of its family."""
    from sanarl.methods.group_rl.quantize import Int8DynamicLinear

    family = outcome.task.view.rollout.family
    m = outcome.task.view.rollout.num_candidates or k
    kept = prompts * k
    drafts = {"diffusionnft": 0, "sol_rl": prompts * m}.get(family, prompts * m - kept)
    assert records[0]["rollout_images"] == kept + drafts
    assert compiled == (["max-autotune-no-cudagraphs"] if family in ("compile", "naive_quant") else [])
    rollouts = outcome.task.rollouts
    if family in ("naive_quant", "sol_rl"):  # the int8 CPU backend really ran
        copy_ = rollouts.preview_copy if family == "sol_rl" else rollouts.full_copy
        assert any(isinstance(m, Int8DynamicLinear) for m in copy_.module.modules())
