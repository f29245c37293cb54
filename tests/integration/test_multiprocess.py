"""Distributed training on CPU: ONE `accelerate launch --multi_gpu --num_processes 2` (gloo) runs
tests/data/ddp_checks.py, whose results are checked here against 1-process runs of the same functions.

Checked: DDP ranks end with identical weights; each rank reads a disjoint half of the global batch; 2 processes
equal 1 process with the same global batch (loss and weights, given the same per-rank noise); only rank 0 writes
(one checkpoint layout, no per-rank files); resume in 2 processes equals an uninterrupted run; NFT advantages are
computed over all ranks' rewards (global std) and each rank keeps its slice; DDRL in 2 processes equals 1 process. A second launch runs the same
functions under FSDP2 (sanarl/data/accelerate/fsdp_cpu.yaml): sharded training, resume and export work, and FSDP ends
where DDP ends.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("accelerate")]  # one launcher at a time: port 29500

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "data"))
from launching import accelerate_launch  # noqa: E402


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Path:
    args = ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no"]
    args += ["--dynamo_backend", "no"]
    return accelerate_launch(args, "ddp_checks.py", tmp_path_factory.mktemp("ddp"), OMP_NUM_THREADS="1")


def _report(out: Path, rank: int) -> dict:
    return json.loads((out / f"rank{rank}.json").read_text())


def _records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_ranks_split_the_global_batch_and_keep_identical_weights(launched):
    ranks = [_report(launched, r) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    from sanarl.training.data_order import step_indices

    steps, per_rank = 3, 4  # train_batch_per_replica 8 = 2 ranks x 4
    for rank, report in enumerate(ranks):  # rank 0 then reads the validation prompts
        expected = [step_indices(4096, 42, k, rank=rank, world=2, per_rank=per_rank) for k in range(steps)]
        assert (
            report["reads"][0] == 0
        )  # the start's sample-size check (sanarl.training.preflight) reads item 0
        assert report["reads"][1 : steps * per_rank + 1] == sum(expected, [])
    reads = [set(r["reads"][1 : steps * per_rank + 1]) for r in ranks]
    assert not reads[0] & reads[1] and len(reads[0] | reads[1]) == steps * per_rank * 2
    for name in ("sft3", "resumed4", "nft", "ddrl"):
        w0, w1 = (load_file(str(launched / f"{name}_rank{r}.safetensors")) for r in (0, 1))
        assert all(torch.equal(w0[k], w1[k]) for k in w0), name


def test_only_rank_zero_writes_one_checkpoint_layout(launched):
    run = launched / "a"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [f"step_0000000{i}" for i in (2, 3, 4)]
    for ckpt in (run / "checkpoints").iterdir():
        assert sorted(p.name for p in ckpt.iterdir()) == [
            "ema.safetensors",
            "meta.json",
            "model.safetensors",
            "state.pt",
        ]
        assert json.loads((ckpt / "meta.json").read_text())["world_size"] == 2
    assert sorted(p.name for p in (run / "samples").iterdir()) == ["step_00000003.png", "step_00000004.png"]
    assert [r["step"] for r in _records(run)] == [1, 2, 3, 4]  # one writer: no duplicated lines
    assert (run / "export" / "transformer").is_dir()


def test_resume_in_two_processes_equals_an_uninterrupted_run(launched):
    for rank in (0, 1):
        resumed = load_file(str(launched / f"resumed4_rank{rank}.safetensors"))
        straight = load_file(str(launched / f"straight4_rank{rank}.safetensors"))
        assert all(torch.equal(resumed[k], straight[k]) for k in straight)
    assert _records(launched / "a")[3]["loss"] == pytest.approx(_records(launched / "b")[3]["loss"], rel=1e-6)


def test_two_processes_equal_one_process_with_the_same_global_batch(launched, tmp_path, monkeypatch):
    import ddp_checks

    from sanarl.methods.sft import task as sft
    from sanarl.training.data_order import step_generator

    original, real_noise, seen = sft.SFTTask.micro_batches, sft.draw_flow_matching_noise, {}

    def remember_step(self, step, rng):
        seen.update(seed=self.run.seed, step=step)
        return original(self, step, rng)

    def two_rank_noise(
        diff, count, latent, rng
    ):  # what ranks 0 and 1 draw from their (seed, step, rank) generators
        gens = [step_generator(seen["seed"], seen["step"], r) for r in (0, 1)]
        parts = [real_noise(diff, count // 2, latent, g) for g in gens]
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}

    monkeypatch.setattr(sft.SFTTask, "micro_batches", remember_step)
    monkeypatch.setattr(sft, "draw_flow_matching_noise", two_rank_noise)
    one = ddp_checks.sft(tmp_path / "one", 3, "validation.enable=false")
    assert one.task.world == 1
    single, double = _records(tmp_path / "one"), _records(launched / "a")[:3]
    for a, b in zip(single, double, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    w1 = ddp_checks.weights(one)
    w2 = load_file(str(launched / "sft3_rank0.safetensors"))
    worst = max(float((w1[k] - w2[k]).abs().max()) for k in w2)
    assert worst < 5e-5, worst  # AdamW after 3 steps: all-reduce order noise, amplified


def test_nft_advantages_use_all_ranks_rewards_and_match_one_rank_with_both_groups(launched, tmp_path):
    import ddp_checks

    ranks = [_report(launched, r)["advantages"][0] for r in (0, 1)]
    assert ranks[0]["prompts"] != ranks[1]["prompts"]  # one whole prompt group per rank
    rewards = torch.tensor(ranks[0]["rewards"] + ranks[1]["rewards"], dtype=torch.float64)
    adv = torch.tensor(ranks[0]["adv"] + ranks[1]["adv"], dtype=torch.float64)
    sd = rewards.std(
        correction=0
    )  # global std over both ranks (docs/algorithms.md: A = (R - mean_group) / std_all)
    expected = torch.cat([(g - g.mean()) / (sd + 1e-4) for g in rewards.split(4)])
    assert torch.allclose(adv, expected, atol=1e-5)
    local = rewards[:4]
    assert not torch.allclose(adv[:4], (local - local.mean()) / (local.std(correction=0) + 1e-4), atol=1e-3)
    recorded: list = []
    ddp_checks.nft(tmp_path / "nft1", recorded)
    one = recorded[0]
    assert one["prompts"] == ranks[0]["prompts"] + ranks[1]["prompts"]
    assert torch.allclose(torch.tensor(one["rewards"], dtype=torch.float64), rewards, atol=1e-6)
    assert torch.allclose(torch.tensor(one["adv"], dtype=torch.float64), adv, atol=1e-5)


def test_ddrl_in_two_processes_equals_one_process_with_both_groups(launched, tmp_path):
    """DDRL's policy and data terms share one forward per backward (DDP), and with explicit steps and the rollout's
    own noise nothing depends on the rank: 2 ranks of one group each end where 1 rank with both groups ends."""
    import ddp_checks

    one = ddp_checks.ddrl(tmp_path / "ddrl1")
    assert one.task.world == 1
    w1, w2 = ddp_checks.weights(one), load_file(str(launched / "ddrl_rank0.safetensors"))
    lora = [k for k in w2 if "lora_" in k]
    assert (
        lora and max(float(w2[k].abs().max()) for k in lora if "lora_B" in k) > 0
    )  # training moved the adapter
    worst = max(float((w1[k] - w2[k]).abs().max()) for k in w2)
    assert worst < 5e-5, worst
    records = _records(tmp_path / "ddrl1") + _records(launched / "ddrl")
    assert len(records) == 4 and all(r["data_loss"] > 0 for r in records)


@pytest.fixture(scope="module")
def launched_fsdp(tmp_path_factory) -> Path:
    """The same SFT / NFT functions under FSDP2 over 2 CPU processes (sanarl/data/accelerate/fsdp_cpu.yaml)."""
    args = ["--config_file", str(ROOT / "sanarl" / "data" / "accelerate" / "fsdp_cpu.yaml")]
    return accelerate_launch(args, "ddp_fsdp.py", tmp_path_factory.mktemp("fsdp"), OMP_NUM_THREADS="1")


def test_fsdp_on_cpu_shards_trains_resumes_and_exports(launched_fsdp):
    from fsdp_expectations import check_fsdp_launch

    check_fsdp_launch(launched_fsdp, world=2)


def test_fsdp_equals_ddp_with_the_same_global_batch(launched, launched_fsdp):
    """Same data, noise and global batch: FSDP2 (reduce-scatter of gradients, sharded AdamW) and DDP (all-reduce,
    replicated AdamW) end at the same weights, up to reduction-order noise; so do the NFT LoRA runs."""
    from fsdp_expectations import gathered

    for name in ("sft3", "nft"):
        ddp, fsdp = gathered(launched, name), gathered(launched_fsdp, name)
        assert set(ddp) == set(fsdp), name
        worst = max(float((ddp[k] - fsdp[k]).abs().max()) for k in ddp)
        assert worst < 5e-5, (name, worst)
    initial = load_file(str(launched / "fsdp_reference.safetensors"))  # the model before training
    sft3 = gathered(launched_fsdp, "sft3")
    assert max(float((sft3[k] - initial[k]).abs().max()) for k in initial) > 1e-3  # training moved it


def test_fsdp_helpers_gather_for_export_and_scatter_back_for_resume(launched):
    """torch's fully_shard over gloo (what accelerate's FSDP2 does on GPUs): under `full_parameters` the sharded
    model is a plain one (state_dict of full tensors, diffusers' own class name in the export), and full tensors
    loaded with `load_full_state` land in the shards."""
    from diffusers import SanaTransformer2DModel

    for rank in (0, 1):
        report = _report(launched, rank)["fsdp_helpers"]
        assert report == {
            "sharded": True,
            "gathered_equal": True,
            "still_sharded": True,
            "written_back": True,
            "reshard_ok": True,
            "unexpected": ["not.a.key"],
            "class": "FSDPSanaTransformer2DModel",
        }
    exported = SanaTransformer2DModel.from_pretrained(str(launched / "fsdp_export")).state_dict()
    reference = load_file(str(launched / "fsdp_reference.safetensors"))
    assert set(exported) == set(reference) and all(torch.equal(exported[k], reference[k]) for k in reference)


def test_resume_with_another_world_size_is_refused(launched, tmp_path):
    import ddp_checks

    from sanarl.errors import UserError

    with pytest.raises(
        UserError, match="written by 2 processes but this run has 1; resume with the same world"
    ):
        ddp_checks.sft(tmp_path / "other", 5, f"train.resume={launched / 'a'}", "validation.enable=false")
