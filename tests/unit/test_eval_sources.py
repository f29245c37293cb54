"""`sanarl eval` inputs: checkpoint resolution (newest step, EMA, LoRA), prompt sources, reward names."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from sanarl.config import dump_toml
from sanarl.core.lora import lora_parameters
from sanarl.errors import ConfigError, DataError
from sanarl.evaluation.apply_checkpoint import _add_lora
from sanarl.evaluation.generation import evaluate_rewards
from sanarl.evaluation.prompts import load_prompts, take
from sanarl.evaluation.sources import load_source, resolve_checkpoint, resolve_model
from sanarl.methods.config_loading import load_config
from sanarl.rewards.held_out import build_rewards, score_images
from sanarl.training.run_folder.checkpoint_store import save_checkpoint

PRESETS = Path(__file__).resolve().parents[2] / "sanarl" / "presets"


def _run(tmp_path: Path, preset: str) -> tuple[Path, object]:
    """A run directory with the config of `preset` on the random-init tiny model."""
    cfg = load_config(PRESETS / f"{preset}.toml", ["policy.model_name_or_path=sanarl-tiny:shapes"]).config
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(dump_toml(cfg))
    return run, cfg


def test_full_finetune_checkpoint_newest_step_and_ema(tmp_path):
    run, cfg = _run(tmp_path, "tiny-shapes-sft")
    base = resolve_model("sanarl-tiny:shapes", cfg)
    transformer = load_source(base).transformer
    params = {k: v.detach().clone() for k, v in transformer.named_parameters()}
    state = {k: v.clone() for k, v in transformer.state_dict().items()}
    for step, shift in ((1, 10.0), (3, 1.0)):  # the newest (3) must win
        model = {k: v + shift for k, v in state.items()}
        ema = {k: v + 2 * shift for k, v in params.items()}
        save_checkpoint(run / "checkpoints", step, {"model": model, "ema": ema}, {}, {})
    source = resolve_checkpoint(str(run))
    assert source.kind == "checkpoint" and source.checkpoint.name == "step_00000003"
    assert source.label == "run/step_00000003"
    loaded = dict(load_source(source).transformer.named_parameters())
    name = next(iter(params))
    torch.testing.assert_close(loaded[name], params[name] + 2.0)  # EMA of step 3
    source.use_ema = False
    raw = dict(load_source(source).transformer.named_parameters())
    torch.testing.assert_close(raw[name], params[name] + 1.0)  # model weights of step 3
    same = resolve_checkpoint(str(run / "checkpoints" / "step_00000001"))
    assert (
        same.checkpoint.name == "step_00000001"
        and same.config.policy.model_name_or_path == "sanarl-tiny:shapes"
    )


def test_lora_checkpoint_restores_every_adapter_and_ema_of_default(tmp_path):
    run, cfg = _run(tmp_path, "tiny-shapes-nft")
    adapter = load_source(resolve_model("sanarl-tiny:shapes", cfg))
    module = adapter.transformer
    _add_lora(module, cfg, adapter.default_lora_targets)
    lora = lora_parameters(module)
    model = {k: torch.full_like(v, 0.02 if ".old." in k else 0.01) for k, v in lora.items()}
    ema = {k: torch.full_like(v, 0.05) for k, v in lora.items() if ".default." in k}
    save_checkpoint(run / "checkpoints", 2, {"model": model, "ema": ema}, {}, {})
    loaded = lora_parameters(load_source(resolve_checkpoint(str(run))).transformer)
    assert set(loaded) == set(model)
    for key, value in loaded.items():
        assert torch.all(value == (0.02 if ".old." in key else 0.05)), key
    # EMA shadow not held -> the model weights
    save_checkpoint(run / "checkpoints", 4, {"model": model}, {}, {})
    loaded = lora_parameters(load_source(resolve_checkpoint(str(run))).transformer)
    assert all(torch.all(v == (0.02 if ".old." in k else 0.01)) for k, v in loaded.items())


def test_export_dirs_and_bad_checkpoint_paths(tmp_path):
    run, cfg = _run(tmp_path, "tiny-shapes-nft")
    with pytest.raises(DataError, match="holds no checkpoint"):
        resolve_checkpoint(str(run))
    export = run / "export"
    export.mkdir()
    save_file({"x": torch.zeros(1)}, str(export / "pytorch_lora_weights.safetensors"))
    for spec in (run, export):  # a run without checkpoints falls back to its export
        source = resolve_checkpoint(str(spec))
        assert (source.kind, source.lora_dir, source.label) == ("lora", export, "run/export")
        assert source.config.policy.lora is not None
    with pytest.raises(DataError, match="not a directory"):
        resolve_checkpoint(str(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="holds no checkpoint"):
        resolve_checkpoint(str(empty))
    lonely = tmp_path / "lonely" / "checkpoints"
    save_checkpoint(lonely, 1, {"model": {"x": torch.zeros(1)}}, {}, {})
    with pytest.raises(DataError, match="--config"):
        resolve_checkpoint(str(lonely.parent))
    assert resolve_checkpoint(str(lonely.parent), cfg).checkpoint.name == "step_00000001"


def test_prompt_sources(tmp_path):
    txt = tmp_path / "p.txt"
    txt.write_text("a red circle\n\n a blue square \n")
    rows = load_prompts(str(txt), None)
    assert rows.prompts == ["a red circle", "a blue square"] and rows.metadata == [{}, {}]
    assert rows.tags() is None
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "two circles", "tag": "counting", "include": []}\n')
    rows = load_prompts(str(jsonl), None, num=3)  # cycles: 3 samples of 1 prompt
    assert rows.prompts == ["two circles"] * 3 and rows.tags() == ["counting"] * 3
    assert rows.metadata[0] is not rows.metadata[1]
    shapes = load_prompts(None, "shapes:test", num=6, seed=5)
    from sanarl.worlds import shapes as world

    assert [m["prompt"] for m in shapes.metadata] == shapes.prompts
    assert shapes.metadata == [world.sample_item("test", 5, i)[0] for i in range(6)]
    assert all(world.split_of(m) == "test" for m in shapes.metadata)
    geneval = load_prompts(None, "geneval", num=4)
    assert len(geneval) == 4 and geneval.tags() is not None and "include" in geneval.metadata[0]
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    bad = [((str(empty), None), "empty"), ((str(tmp_path / "nope.txt"), None), "does not exist"),
           ((None, "imagenet:test"), "not a known prompt set"), ((None, None), "exactly one"),
           ((None, "shapes:valid"), "shapes:<split>")]  # fmt: skip
    for (prompts, dataset), message in bad:
        with pytest.raises(DataError, match=message):
            load_prompts(prompts, dataset)
    with pytest.raises(DataError, match="--num"):
        take(rows, 0)


def test_reward_names_and_metadata_errors():
    with pytest.raises(ConfigError, match="Known rewards: .*shapes"):
        build_rewards(["shapes", "shapez"])
    with pytest.raises(ConfigError, match="empty"):
        build_rewards([""])
    rewards = build_rewards(["shapes", "shapes"])
    assert list(rewards) == ["shapes"]
    with pytest.raises(DataError, match="'a cat' has no shapes-world metadata.*shapes grammar"):
        score_images(torch.zeros(1, 3, 32, 32), ["a cat"], [{}], rewards)


def test_evaluate_rewards_equals_scoring_the_generated_images():
    from sanarl.evaluation.run import EvalSettings, generation_spec
    from sanarl.training.sampling import generate_images

    source = resolve_model("sanarl-tiny:shapes")
    adapter = load_source(source)
    adapter.transformer.train()
    spec = generation_spec(source.config, adapter, EvalSettings(num_steps=2))
    rows = load_prompts(None, "shapes:test", num=3, seed=1)
    seeds = [7, 8, 9]
    means = evaluate_rewards(adapter, rows.prompts, rows.metadata, seeds, spec, ["jpeg_compressibility", "shapes"],
                             batch_size=2)  # fmt: skip
    assert adapter.transformer.training  # mode restored
    images = generate_images(adapter, rows.prompts, seeds, spec)
    oracle = score_images(
        images, rows.prompts, rows.metadata, build_rewards(["jpeg_compressibility", "shapes"])
    )
    assert set(means) == set(oracle)
    for key, values in oracle.items():
        assert means[key] == pytest.approx(sum(values) / len(values), rel=1e-5, abs=1e-6), key
