"""The SOAR task (docs/algorithms.md, "SOAR"): aux point counts, oracle targets, the loss normalisation by hand,
micro-batch / rank split invariance, bad config, and short tiny-SANA runs on CPU."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image
from torch import nn

import sanarl
from sanarl import api
from sanarl.config.schema import Config
from sanarl.errors import ConfigError, DataError
from sanarl.methods.config_loading import load_config
from sanarl.methods.soar.config import view
from sanarl.methods.soar.task import SOARTask, aux_count, aux_points, draw_randomness, loss_scale, soar_levels
from sanarl.models.base import Cond, DiffusionAdapter
from sanarl.training.data_order import split_batch
from sanarl.training.tracking import read_metrics

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "tests" / "data" / "presets" / "soar-tiny.toml"


# --- a model-free adapter: latents = images, prompts -> a 2-d embedding -------------------------------------------
class ConstVelocity(nn.Module):
    """v = a everywhere (a starts at 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.zeros(()))

    def forward(self, x, s, embeds):
        return self.a.expand_as(x)


class TinyNet(nn.Module):
    """v = W x (per pixel) + s b + (embedding mixed into the channels): depends on every input."""

    def __init__(self, channels: int = 3) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.weight = nn.Parameter(torch.randn(channels, channels, generator=gen) / channels)
        self.b = nn.Parameter(torch.randn(channels, generator=gen))
        self.text = nn.Parameter(torch.randn(channels, 2, generator=gen))

    def forward(self, x, s, embeds):
        text = embeds.mean(1) @ self.text.T  # [B, C]
        return torch.einsum("oc,bchw->bohw", self.weight, x) + (s[:, None] * self.b + text)[:, :, None, None]


class FakeAdapter(DiffusionAdapter):
    family = "fake"

    def __init__(self, model: nn.Module, factor: int = 1) -> None:
        super().__init__()
        self.transformer, self.pipeline, self.factor = model, None, factor
        self.device = torch.device("cpu")
        self.default_shift = 1.0

    def encode_prompts(self, prompts):
        embeds = torch.tensor([[[len(p) / 10.0, float(p.count("a"))]] for p in prompts])
        return Cond(embeds=embeds, mask=torch.ones(len(prompts), 1))

    def _forward(self, module, x, s, cond):
        return module(x, s, cond.embeds)

    def encode_images(self, images):
        return images.float()

    def decode(self, latents):
        return latents

    def latent_shape(self, height, width):
        if height % self.factor or width % self.factor:
            raise ValueError(f"image size {height}x{width} is not divisible by the VAE factor {self.factor}")
        return (3, height, width)


class Images(torch.utils.data.Dataset):
    def __init__(self, n: int = 16, size: int = 4) -> None:
        gen = torch.Generator().manual_seed(1)
        self.images = torch.rand(n, 3, size, size, generator=gen)
        self.prompts = [f"a {'cat' * (i % 3 + 1)} {i}" for i in range(n)]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i):
        return {"prompt": self.prompts[i], "image": self.images[i]}


def _plugin(dataset=None):
    return SimpleNamespace(__name__="fake_plugin", get_dataset=lambda cfg: dataset or Images())


def _cfg(batch: int = 8, mini: int = 8, **soar) -> Config:
    cfg = Config()
    cfg.train.train_batch_per_replica, cfg.train.train_policy.mini_batch = batch, mini
    cfg.train.train_policy.trainer_type = "soar"
    for k, v in soar.items():
        setattr(cfg.train.train_policy.soar, k, v)
    return cfg


def _grads(task: SOARTask, micro: list[dict]) -> torch.Tensor:
    """The runner's accumulation: backward(loss / number of micro-batches) over the micro-batches."""
    task.adapter.transformer.zero_grad()
    for mb in micro:
        loss, _ = task.objective(mb, torch.Generator())
        (loss / len(micro)).backward()
    return torch.cat([p.grad.flatten() for p in task.adapter.transformer.parameters()])


# --- the pieces -----------------------------------------------------------------------------------------------------
def test_levels_and_boundary() -> None:
    u = torch.tensor([0.5, 0.25, 0.2, 1.0])
    s0, s1, active = soar_levels(
        u, 4, 3.0, "continuous"
    )  # t1 = [0.25, 0, 0, 0.75]; shift(u, 3) = 3u / (1 + 2u)
    torch.testing.assert_close(s0, torch.tensor([0.75, 0.5, 0.6 / 1.4, 1.0]))
    torch.testing.assert_close(s1, torch.tensor([0.5, 0.0, 0.0, 2.25 / 2.5]))
    assert active.tolist() == [True, False, False, True]


def test_level_grid_changes_only_the_levels() -> None:
    """Same seed, either grid: every draw but s0, s1 (and s' through its range [s1, min(ratio s0, 1)]) is equal,
    the same random numbers are consumed, and each grid's levels are `soar_levels` of the drawn u."""
    draws, after = {}, {}
    for grid in ("scheduler_table", "continuous"):
        cfg = _cfg(num_rollout_paths=2, trajectory_length=3, num_sampling_steps=5, level_grid=grid)
        cfg.policy.diffusers.caption_dropout = 0.3
        gen = torch.Generator().manual_seed(7)
        draws[grid] = draw_randomness(64, (3, 2, 2), view(cfg), 3.0, gen)
        after[grid] = torch.rand(4, generator=gen)
        s0, s1, active = soar_levels(draws[grid]["u"], 5, 3.0, grid)
        assert torch.equal(draws[grid]["s0"], s0) and torch.equal(draws[grid]["s1"], s1)
        assert torch.equal(draws[grid]["active"], active)
    table, cont = draws["scheduler_table"], draws["continuous"]
    torch.testing.assert_close(after["scheduler_table"], after["continuous"], rtol=0, atol=0)
    for key in ("u", "noise", "keep_caption", "active", "path_noise"):
        assert torch.equal(table[key], cont[key]), key
    assert not torch.equal(table["s0"], cont["s0"]) and not torch.equal(table["s1"], cont["s1"])
    # the table rounds t up to the 1/1000 grid: s0 >= shift(u) within one table spacing
    assert bool((table["s0"] >= cont["s0"]).all()) and float((table["s0"] - cont["s0"]).max()) < 3.0e-3
    # s' = s1 + f (s_up - s1): the same fractions f under both grids
    fractions = {}
    for grid, d in draws.items():
        upper = torch.clamp(1.5 * d["s0"], max=1.0)[:, None, None]
        fractions[grid] = (d["s_prime"] - d["s1"][:, None, None]) / (upper - d["s1"][:, None, None])
    torch.testing.assert_close(fractions["scheduler_table"], fractions["continuous"], rtol=0, atol=1e-5)
    # only the table mode carries its shift (aux_points reads the s0 = 1 stand-in and the aux model level from it)
    assert "table_shift" not in cont and table["table_shift"].tolist() == [3.0] * 64


@pytest.mark.parametrize("grid", ["scheduler_table", "continuous"])
def test_aux_rows_velocity_level_follows_the_grid(grid, monkeypatch) -> None:
    """HY-SOAR evaluates the auxiliary rows at `aux_model_level` of s' on the table (targets and weights keep s');
    the continuous grid evaluates them at s'. The main rows see s0 either way."""
    from sanarl.methods.soar.task import aux_model_level, scheduler_table

    cfg = _cfg(
        batch=4, mini=4, num_rollout_paths=2, trajectory_length=3, num_sampling_steps=5, level_grid=grid
    )
    task = SOARTask(cfg, FakeAdapter(TinyNet()), _plugin())
    batch = task.micro_batches(0, torch.Generator().manual_seed(2))[0]
    seen = []
    original = FakeAdapter.velocity
    monkeypatch.setattr(
        FakeAdapter,
        "velocity",
        lambda self, x, s, cond, module=None: seen.append(s) or original(self, x, s, cond, module),
    )
    task.objective(batch, torch.Generator())
    z0 = batch["image"].float()
    z_s0 = (1 - batch["s0"].view(4, 1, 1, 1)) * z0 + batch["s0"].view(4, 1, 1, 1) * batch["noise"]
    aux = aux_points(z0, batch["noise"], z_s0, torch.zeros_like(z0), batch, "flow_sde", 0.5)
    if grid == "continuous":
        expected = aux.s
    else:
        expected = aux_model_level(aux.s, scheduler_table(float(batch["table_shift"][0])))
    torch.testing.assert_close(aux.s_model, expected, rtol=0, atol=0)
    torch.testing.assert_close(seen[-1], torch.cat([batch["s0"], expected]), rtol=0, atol=0)
    if grid == "scheduler_table":
        assert not torch.equal(aux.s_model, aux.s)


@pytest.mark.parametrize("boundary", [True, False])
def test_aux_points_count_is_paths_times_points_per_active_sample(boundary) -> None:
    """HY-SOAR: M P points per sample off the boundary, the ODE path's P at it (0 with boundary_aux_points off)."""
    cfg = _cfg(num_rollout_paths=3, trajectory_length=4, num_sampling_steps=2, sde_rollout_type="cps")
    draws = draw_randomness(16, (3, 2, 2), view(cfg), 1.0, torch.Generator().manual_seed(0))
    z0 = torch.randn(16, 3, 2, 2)
    z_s0 = z0 + 0.1
    aux = aux_points(z0, draws["noise"], z_s0, torch.randn_like(z0), draws, "cps", 0.5, boundary)
    active = draws["active"]
    assert 0 < int(active.sum()) < 16  # with N = 2 about half of the samples sit at the boundary
    counts = torch.bincount(aux.owner, minlength=16)
    at_boundary = 4 if boundary else 0
    assert counts.tolist() == [12 if a else at_boundary for a in active.tolist()]
    n = 12 * int(active.sum()) + at_boundary * int((~active).sum())
    assert aux.z.shape == (n, 3, 2, 2) and aux.s.shape == aux.owner.shape
    assert aux_count(16, int(active.sum()), 3, 4, boundary) == n
    # (path, point, row) order: path 0 from every sample (or the active ones), paths 1..2 from the active ones
    rows = active.nonzero().flatten()
    first = torch.arange(16) if boundary else rows
    expected = [draws["s_prime"][first, 0, p] for p in range(4)]
    expected += [draws["s_prime"][rows, m, p] for m in (1, 2) for p in range(4)]
    torch.testing.assert_close(aux.s, torch.cat(expected))


def test_oracle_velocity_ode_points_lie_on_the_true_path_and_target_z1_minus_z0() -> None:
    cfg = _cfg(num_rollout_paths=2, trajectory_length=5, num_sampling_steps=10, sde_rollout_type="sde")
    gen = torch.Generator().manual_seed(3)
    draws = draw_randomness(6, (3, 2, 2), view(cfg), 3.0, gen)
    draws["s0"], draws["s1"], draws["active"] = soar_levels(torch.linspace(0.3, 0.9, 6), 10, 3.0)
    z0, z1 = torch.randn(6, 3, 2, 2, generator=gen), draws["noise"]
    b = (6, 1, 1, 1)
    z_s0 = (1 - draws["s0"].view(b)) * z0 + draws["s0"].view(b) * z1
    aux = aux_points(z0, z1, z_s0, z1 - z0, draws, "sde", 0.5)
    # (path, point, sample) order -> (sample, path, point)
    z = aux.z.view(2, 5, 6, 3, 2, 2).permute(2, 0, 1, 3, 4, 5)
    s = aux.s.view(2, 5, 6).permute(2, 0, 1)
    target = aux.target.view(2, 5, 6, 3, 2, 2).permute(2, 0, 1, 3, 4, 5)
    sp = s[:, 0].reshape(6, 5, 1, 1, 1)
    torch.testing.assert_close(z[:, 0], (1 - sp) * z0[:, None] + sp * z1[:, None], rtol=0, atol=1e-5)
    torch.testing.assert_close(target[:, 0], (z1 - z0)[:, None].expand(6, 5, 3, 2, 2), rtol=0, atol=1e-4)
    # path 1 ("sde"): z1' = (1 - s1)(z - s0 v) + s1 n = (1 - s1) z0 + s1 n, then z' on the segment z1' -> z1
    s1 = draws["s1"].view(b)
    z1p = (1 - s1) * z0 + s1 * draws["path_noise"][:, 0]
    alpha = ((s[:, 1] - draws["s1"][:, None]) / (1 - draws["s1"][:, None])).reshape(6, 5, 1, 1, 1)
    torch.testing.assert_close(z[:, 1], (1 - alpha) * z1p[:, None] + alpha * z1[:, None], rtol=0, atol=1e-5)
    assert not torch.allclose(target[:, 1], (z1 - z0)[:, None].expand(6, 5, 3, 2, 2), atol=1e-2)


def _w(scheme: str, s: float) -> float:
    """w(s) of the loss weighting schemes, by hand (cosmap: 2 / (pi (1 - 2 s + 2 s^2)))."""
    return 2 / (math.pi * (1 - 2 * s + 2 * s * s)) if scheme == "cosmap" else 1.0


@pytest.mark.parametrize(
    ("boundary", "scheme"), [(True, "logit_normal"), (False, "logit_normal"), (True, "cosmap")]
)
def test_loss_normalisation_by_hand(boundary, scheme) -> None:
    """Sample 0: z0 = 1, z1 = 3, u = 0.5 (s0 = 0.5, s1 = 0.25), s' = 0.5; sample 1 at the boundary (u = 0.2, N = 4:
    s0 = 0.2, s1 = 0), z0 = 0, z1 = 1, s' = 0.1.

    With v = 0: z_s0 = 2, z1' = 2, a = (0.5 - 0.25) / 0.75 = 1/3, z' = 7/3, target (7/3 - 1) / 0.5 = 8/3.
    Boundary (HY-SOAR keeps its ODE path): z_s0 = z1' = 0.2, a = 0.1, z' = 0.28, target 2.8.
    mse: main 2^2 = 4 and 1^2 = 1, aux (8/3)^2 = 64/9 and 2.8^2 = 7.84. lambda 0.5:
    (4 + 1 + 0.5 (64/9 + 7.84)) / (2 + 0.5 * 2); without the boundary's point (4 + 1 + 0.5 * 64/9) / (2 + 0.5 * 1).
    A weighting scheme weighs the main rows by w(s0) and, as HY-SOAR, the auxiliary rows by w(s').
    """
    cfg = _cfg(
        batch=2,
        mini=2,
        lambda_aux=0.5,
        trajectory_length=1,
        num_sampling_steps=4,
        cfg_scale_sampling=4.5,
        boundary_aux_points=boundary,
    )
    cfg.policy.diffusers.weighting_scheme = scheme
    task = SOARTask(cfg, FakeAdapter(ConstVelocity()), _plugin())
    s0, s1, active = soar_levels(torch.tensor([0.5, 0.2]), 4, 1.0, "continuous")  # the docstring's s1 = 0
    n_aux = 2 if boundary else 1
    batch = {
        "prompt": ["a", "b"],
        "image": torch.tensor([1.0, 0.0]).view(2, 1, 1, 1),
        "noise": torch.tensor([3.0, 1.0]).view(2, 1, 1, 1),
        "keep_caption": torch.tensor([True, True]),
        "s0": s0,
        "s1": s1,
        "active": active,
        "s_prime": torch.tensor([0.5, 0.1]).view(2, 1, 1),
        "path_noise": torch.zeros(2, 0, 1, 1, 1),
        "loss_scale": torch.full((2,), loss_scale(2, n_aux, 0.5, 1, 1), dtype=torch.float64),
        "main_scale": torch.full((2,), 0.5, dtype=torch.float64),
        "aux_scale": torch.full((2,), 1.0 / n_aux, dtype=torch.float64),
    }
    w_main = [_w(scheme, 0.5), _w(scheme, 0.2)]
    w_aux = [_w(scheme, 0.5), _w(scheme, 0.1)][:n_aux]
    aux_sq = [w * e for w, e in zip(w_aux, [64 / 9, 7.84], strict=False)]
    aux_err = [w * e for w, e in zip(w_aux, [8 / 3, 2.8], strict=False)]
    main_sq = w_main[0] * 4 + w_main[1] * 1
    denominator = 2 + 0.5 * n_aux
    loss, metrics = task.objective(batch, torch.Generator())
    assert loss.item() == pytest.approx((main_sq + 0.5 * sum(aux_sq)) / denominator, rel=1e-6)
    assert metrics["loss_main"] == pytest.approx(main_sq / 2, rel=1e-6)
    assert metrics["loss_aux"] == pytest.approx(sum(aux_sq) / n_aux, rel=1e-6)
    loss.backward()  # d/da at a = 0: (w 2(0 - 2) + w 2(0 - 1) + 0.5 sum w 2(0 - target)) / denominator
    expected = (-4 * w_main[0] - 2 * w_main[1] - sum(aux_err)) / denominator
    assert task.adapter.transformer.a.grad.item() == pytest.approx(expected, rel=1e-6)


def test_caption_dropout_is_per_batch_and_reaches_the_rollout(monkeypatch) -> None:
    """HY-SOAR drops the captions of a whole batch at once, and the rollout velocity then sees "" too."""
    cfg = _cfg(batch=8, mini=8, trajectory_length=1, num_sampling_steps=4)
    cfg.policy.diffusers.caption_dropout = 0.5
    keeps = [
        draw_randomness(8, (3, 4, 4), view(cfg), 1.0, torch.Generator().manual_seed(seed))["keep_caption"]
        for seed in range(40)
    ]
    assert all(bool((k == k[0]).all()) for k in keeps)  # one draw per batch
    assert {bool(k[0]) for k in keeps} == {True, False}
    task = SOARTask(cfg, FakeAdapter(TinyNet()), _plugin())
    seen = []
    original = SOARTask.rollout_velocity
    monkeypatch.setattr(
        SOARTask, "rollout_velocity", lambda self, z, s, cond: seen.append(cond) or original(self, z, s, cond)
    )
    seed = next(i for i, k in enumerate(keeps) if not bool(k[0]))
    batch = task.micro_batches(0, torch.Generator().manual_seed(seed))[0]
    assert not bool(batch["keep_caption"].any())
    task.objective(batch, torch.Generator())
    empty = task.adapter.encode_prompts([""] * 8)
    torch.testing.assert_close(seen[0].embeds, empty.embeds)


def test_micro_batch_and_rank_splits_give_the_same_gradient(monkeypatch) -> None:
    soar = dict(
        num_rollout_paths=2, trajectory_length=3, num_sampling_steps=3, cfg_scale_sampling=3.0, lambda_aux=0.7
    )
    whole = SOARTask(_cfg(8, 8, **soar), FakeAdapter(TinyNet()), _plugin())
    whole.view.diffusers.caption_dropout = 0.3
    micro = whole.micro_batches(0, torch.Generator().manual_seed(5))
    n_aux = whole.collect_metrics()["num_aux_points"]
    active = int(micro[0]["active"].sum())
    assert 0 < active < 8  # some samples at the boundary, where only the ODE path's 3 points remain
    assert n_aux == 3 * (2 * active + (8 - active))
    g_whole = _grads(whole, micro)

    split = SOARTask(_cfg(8, 2, **soar), FakeAdapter(TinyNet()), _plugin())
    split.view.diffusers.caption_dropout = 0.3
    micro4 = split.micro_batches(0, torch.Generator().manual_seed(5))
    assert len(micro4) == 4
    torch.testing.assert_close(_grads(split, micro4), g_whole, rtol=1e-5, atol=1e-7)

    # two ranks of 4 with the all-reduced counts: the DDP average of their gradients equals one rank of 8
    ranks = split_batch(micro[0], 4)
    for r in ranks:
        r["loss_scale"] = torch.full((4,), loss_scale(8, n_aux, 0.7, 1, 2), dtype=torch.float64)
    g_ranks = sum(_grads(whole, [r]) for r in ranks) / 2
    torch.testing.assert_close(g_ranks, g_whole, rtol=1e-5, atol=1e-7)

    # a rank's own micro_batches uses the global counts returned by the all-reduce
    import sanarl.methods.soar.task as soar_module

    monkeypatch.setattr(soar_module, "global_sum", lambda values, device: [8.0, 30.0, 3.0])
    rank1 = SOARTask(_cfg(8, 2, **soar), FakeAdapter(TinyNet()), _plugin(), rank=1, world=2)
    part = rank1.micro_batches(0, torch.Generator().manual_seed(5))
    assert len(part) == 2 and float(part[0]["loss_scale"][0]) == pytest.approx(2 * 2 / (8 + 0.7 * 30))
    assert rank1.collect_metrics() == {"num_aux_points": 30.0, "boundary_fraction": 3 / 8}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_rollout_paths", 0, "num_rollout_paths` = 0 is out of range; it must be >= 1"),
        ("sigma_upper_ratio", 0.9, "sigma_upper_ratio` = 0.9 is out of range; it must be >= 1"),
        ("sde_rollout_type", "euler", "set it to one of 'simple', 'sde', 'flow_sde', 'cps'"),
        ("level_grid", "table", "level_grid` = 'table' is not supported"),
        ("num_sampling_steps", 1001, "must be <= 1000 with level_grid = scheduler_table"),
        ("trajectory_length", 0, "trajectory_length` = 0 is out of range; it must be >= 1"),
        ("lambda_aux", -1.0, "lambda_aux` = -1.0 is out of range; it must be >= 0"),
    ],
)
def test_bad_soar_settings_are_config_errors(field: str, value, message: str) -> None:
    """One check: a task built in code raises what the loader raises for the same value set with --set."""
    with pytest.raises(ConfigError, match=message):
        SOARTask(_cfg(**{field: value}), FakeAdapter(TinyNet()), _plugin())
    preset = Path(sanarl.__file__).parent / "presets" / "tiny-shapes-soar.toml"
    text = repr(value).replace("'", '"')
    with pytest.raises(ConfigError, match=message):
        load_config(preset, [f"train.train_policy.soar.{field}={text}"])


def _jsonl_data(root: Path, buckets: dict[tuple[int, int], int]) -> Path:
    (root / "images").mkdir(parents=True)
    rows = []
    for (bh, bw), n in buckets.items():
        for i in range(n):
            md5 = f"b{bh}x{bw}i{i}"
            color = ((40 * i) % 255, 100, 200 - 10 * i)
            Image.new("RGB", (bw + 8, bh + 4), color).save(root / "images" / f"{md5}.jpg")
            rows.append(json.dumps({"md5": md5, "caption_en": f"a {i} square", "bw": bw, "bh": bh}))
    (root / "data.jsonl").write_text("\n".join(rows) + "\n")
    return root / "data.jsonl"


def test_bucket_not_divisible_by_the_vae_factor_names_the_row(tmp_path) -> None:
    import sanarl.datasets.soar_jsonl as plugin

    path = _jsonl_data(tmp_path, {(16, 16): 4, (16, 20): 4})
    cfg = _cfg(4, 2)
    cfg.train.train_policy.dataset.local_dir = str(path)
    with pytest.raises(DataError, match=r"data.jsonl:5: bucket bh x bw = 16 x 20 .*VAE factor 8"):
        SOARTask(cfg, FakeAdapter(TinyNet(), factor=8), plugin)
    cfg.train.train_batch_per_replica = 6
    with pytest.raises(DataError, match="no \\(bh, bw\\) bucket has `train.train_batch_per_replica` = 6"):
        SOARTask(cfg, FakeAdapter(TinyNet(), factor=4), plugin)


# --- tiny SANA runs -------------------------------------------------------------------------------------------------
@pytest.fixture
def soar_registered(monkeypatch):
    """Use the registry once SOAR is registered under ("sft", "soar"); until then route task_class to SOARTask."""
    import sanarl.methods.registry as tasks

    try:
        assert tasks.task_class(load_config(PRESET).config) is SOARTask
    except ConfigError:
        monkeypatch.setattr(tasks, "task_class", lambda cfg: SOARTask)


def _initial_weights(cfg) -> dict[str, torch.Tensor]:
    from sanarl.models import load_adapter

    return {k: v.clone() for k, v in load_adapter(cfg.policy).transformer.state_dict().items()}


@pytest.mark.slow
def test_tiny_full_run_on_bucketed_jsonl_logs_soar_metrics_and_trains(tmp_path, soar_registered) -> None:
    path = _jsonl_data(tmp_path / "data", {(32, 32): 4, (16, 32): 5})
    loaded = load_config(
        PRESET, [f"train.output_dir={tmp_path / 'run'}", f"train.train_policy.dataset.local_dir={path}"]
    )
    initial = _initial_weights(loaded.config)
    outcome = api.train(loaded, "sanarl.datasets.soar_jsonl")
    assert (
        outcome.task.steps_per_epoch() == 2
    )  # one batch of 4 from each bucket, the fifth 16x32 row sits out
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert all(math.isfinite(r[k]) for k in ("loss", "loss_main", "loss_aux", "grad_norm"))
        assert r["loss_main"] > 0 and r["loss_aux"] > 0
        assert r["num_aux_points"] == 6 * 4 * (1 - r["boundary_fraction"])  # M P per non-boundary sample
    trained = outcome.task.adapter.transformer.state_dict()
    changed = sum(not torch.equal(initial[k], trained[k]) for k in initial)
    assert changed >= 0.9 * len(initial)
