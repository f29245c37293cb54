"""docs/configuration.md is the schema's own reference: every key documented, the file regenerated as the user
regenerates it (`python -m sanarl.config.reference > docs/configuration.md`) and compared."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sanarl.config import reference

ROOT = Path(__file__).resolve().parents[2]
REFRESH = "python -m sanarl.config.reference > docs/configuration.md"


def test_every_key_of_the_schema_has_a_doc():
    assert reference.undocumented() == [], (
        "write a docstring under each of these fields (sanarl/config/schema.py or the *_schema.py module declaring it)"
    )


def test_docs_configuration_md_is_current():
    out = subprocess.run(
        [sys.executable, "-m", "sanarl.config.reference"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    assert (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8") == out, f"stale: run `{REFRESH}`"


def test_the_reference_lists_every_leaf_key_once_with_its_default():
    text = reference.render()
    for _, _, leaves in reference.keys():
        for key in leaves:
            name = key.dotted.rsplit(".", 1)[-1]
            assert f"| `{name}` | `" in text
    assert "## `[train.train_policy]`" in text
    assert '| `solver` | `"euler" \\| "dpm2" \\| "flow_sde" \\| "cps"` | `"euler"` |' in text
    assert "| `optm_lr` | `float` | `" in text


def test_a_field_without_a_docstring_is_reported():
    from dataclasses import dataclass

    @dataclass
    class Toy:
        documented: int = 1
        """Has a doc."""
        bare: int = 2

    assert reference.field_docs(Toy) == {"documented": "Has a doc.", "bare": ""}


def test_the_methods_column_names_registered_methods_and_each_view_holds_its_declared_keys():
    from dataclasses import fields

    from sanarl.config import group_rl_schema
    from sanarl.methods.registry import METHODS

    named = {m for _, _, leaves in reference.keys() for key in leaves for m in key.methods}
    assert named <= {m.name for m in METHODS}
    text = reference.render()
    assert "| `nft_beta` | `float` | `1.0` | `> 0` | diffusion_nft |" in text
    assert "| `clip_range` | `float` | `0.0001` | `> 0` | flow_grpo, ddrl, awm, mixgrpo |" in text
    assert "| `lambda_aux` | `float` | `1.0` | `>= 0` | soar |" in text
    assert "| `optm_lr` | `float` | `0.0001` | `in (0, 1.0]` | all |" in text
    # the rules on lists, texts and values show as the ranges do
    assert "| `optm_betas` | `list[float]` | `[0.9, 0.999]` | `2 values, each in [0, 1)` | all |" in text
    assert '| `output_dir` | `str` | `"./outputs/run"` | `not empty` | all |' in text
    assert "| `is_diffusers` | `bool` | `true` | `only true` | all |" in text
    # the flat Cosmos-RL section is composed of the method key groups: one declaration per key
    flat = {f.name for f in fields(reference.schema.TrainPolicyConfig)}
    for group in (group_rl_schema.GroupPolicy, group_rl_schema.NFTPolicy, group_rl_schema.FlowGRPOPolicy):
        assert issubclass(reference.schema.TrainPolicyConfig, group)
        assert {f.name for f in fields(group)} <= flat
