"""The distributed sampler (sanarl.training.data_order.step_indices) without processes: every world size covers each item
exactly once per epoch, ranks never overlap, and W ranks read exactly what one rank with the global batch reads."""

from __future__ import annotations

import pytest

from sanarl.training.data_order import step_indices


@pytest.mark.parametrize("world", [1, 2, 4])
def test_each_item_once_per_epoch_and_ranks_disjoint(world):
    size, per_rank = 24, 3
    steps = size // (world * per_rank)  # one epoch
    seen = []
    for step in range(steps):
        ranks = [step_indices(size, 7, step, rank=r, world=world, per_rank=per_rank) for r in range(world)]
        flat = [i for r in ranks for i in r]
        assert len(set(flat)) == len(flat)  # disjoint across ranks
        seen += flat
    assert sorted(seen) == list(range(size))


def test_world_size_invariance_and_epoch_boundary():
    one = [step_indices(10, 3, k, rank=0, world=1, per_rank=4) for k in range(5)]
    two = [
        step_indices(10, 3, k, rank=0, world=2, per_rank=2)
        + step_indices(10, 3, k, rank=1, world=2, per_rank=2)
        for k in range(5)
    ]
    assert one == two
    stream = [i for step in one for i in step]  # positions 0..19 = epochs 0 and 1 of 10 items
    assert sorted(stream[:10]) == list(range(10)) and sorted(stream[10:]) == list(range(10))
    assert stream[:10] != stream[10:]  # a new permutation each epoch (seeded by seed and epoch)


def test_shipped_accelerate_configs_load_with_accelerate():
    from pathlib import Path

    from accelerate.commands.config.config_args import load_config_from_file

    root = Path(__file__).resolve().parents[2] / "sanarl" / "data" / "accelerate"
    expected = {
        "single_gpu": ("NO", 1, 1),
        "ddp_8gpu": ("MULTI_GPU", 8, 1),
        "fsdp_8gpu": ("FSDP", 8, 1),
        "fsdp_2node": ("FSDP", 16, 2),
    }
    for name, (kind, processes, machines) in expected.items():
        cfg = load_config_from_file(str(root / f"{name}.yaml"))
        assert (cfg.distributed_type.value, cfg.num_processes, cfg.num_machines) == (
            kind,
            processes,
            machines,
        )
        assert cfg.mixed_precision == "bf16"
        if kind == "FSDP":
            assert cfg.fsdp_config["fsdp_version"] == 2
            assert cfg.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "SanaTransformerBlock"
            assert cfg.fsdp_config["fsdp_state_dict_type"] == "FULL_STATE_DICT"
