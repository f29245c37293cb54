"""SOAR: reward-free self-correction on (image, caption) data (HY-SOAR, arXiv 2604.12617; docs/algorithms.md,
"SOAR").

One step: (1) this rank's items and every random number of the batch (`micro_batches`: u, z1, levels, aux
levels, path noise, caption dropout); (2) the step's counts N_main, N_aux all-reduced into each micro-batch's loss
scale; then per micro-batch (`objective`): (3) the main row, (4) the rollout step with the current weights and
CFG, (5) the auxiliary points re-noised toward z1, (6) one forward over main and auxiliary rows, (7) the
normalised loss:

Per sample: z0 = VAE(x), noise z1, u ~ the timestep density, s0 = level(u), z_s0 = (1 - s0) z0 + s0 z1, where
level(t) is HY-SOAR's lookup in the scheduler's 1000-level sigma table (`soar.level_grid = "scheduler_table"`,
the default) or shift(t) (`"continuous"`); `soar_levels` is the one place levels are drawn.

    L_main = sum_b w(s0) mse(v_theta(z_s0, s0, c), z1 - z0)          w = 1 for logit_normal / mode / uniform
    v_cfg  = v_u + w_cfg (v_c - v_u) at z_s0, no grad, uncond = ""  (w_cfg = soar.cfg_scale_sampling)
    t1 = max(u - 1 / num_sampling_steps, 0), s1 = level(t1); samples with t1 = 0 are "at the boundary"
    for each of M paths (path 0: Euler, paths 1..M-1: one `sde_rollout_type` step) z1' = step(z_s0, v_cfg, s0 -> s1)
      for each of P points: s' ~ U[s1, min(ratio s0, 1)], z' = renoise_toward(z1', z1, s1, s'),
                            L_aux += sum w(s') mse(v_theta(z', s', c), (z' - z0) / s')
    loss = (L_main + lambda_aux L_aux) / max(N_main + lambda_aux N_aux, 1)     N_* summed over all ranks

Boundary rule (HY-SOAR): a sample with t1 = 0 keeps the ODE path's P points and skips the stochastic paths, so
N_aux = M P per sample off the boundary and P at it; `soar.boundary_aux_points = false` drops the boundary's points
too (their target (z' - z0) / s' divides the rollout's error by an s' that can come close to 0). The boundary
fraction is logged.
Caption dropout (`policy.diffusers.caption_dropout`), as HY-SOAR: one draw per rank and step replaces every caption
of the batch by "", for the rollout velocity and the trained forwards alike.

Normalisation with accumulation and data parallelism: the step's counts N_main, N_aux are known before any forward
(they depend only on the drawn u), so `micro_batches` all-reduces them once and gives every micro-batch the factor
K W / max(N_main + lambda_aux N_aux, 1) (K micro-batches per rank, W ranks). The runner divides each micro-batch
loss by K and DDP averages gradients over W, so the applied gradient is that of
sum_{all ranks, all micro-batches} (L_main + lambda_aux L_aux) / max(N_main + lambda_aux N_aux, 1): the same for
1 x 8 and 4 x 2 micro-batches and for 1 or 2 ranks. The main and auxiliary rows go through one forward.

Per-sample randomness (u, z1, the caption dropout draw, s', the stochastic paths' noise) is drawn for the whole
per-rank batch in `micro_batches` from the step generator, so any micro-batch split gives the same numbers. Data
comes from the plugin's `batch_items(step, rank, world, per_rank)` hook when its dataset has one (bucketed datasets
such as `sanarl.datasets.soar_jsonl`), else from `sanarl.training.data_order.step_indices` as in SFT.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict, get_args

import torch
import torch.distributed as dist
from torch import Tensor

from sanarl.config.choices import LevelGrid
from sanarl.config.dataset_plugins import DatasetPlugin
from sanarl.config.schema import Config
from sanarl.core.flow import interpolate, velocity_target
from sanarl.core.soar_math import aux_sigmas, corrective_target, renoise_toward, soar_normaliser, soar_step
from sanarl.core.timesteps import loss_weight, u_to_sigma
from sanarl.errors import DataError
from sanarl.methods.checked_task import ItemTask
from sanarl.methods.sft.task import draw_flow_matching_noise, draw_vae_noise, encode_media
from sanarl.methods.soar.config import SCHEDULER_TABLE_SIZE, SOARView, view
from sanarl.models.base import Cond, DiffusionAdapter
from sanarl.training.data_order import split_batch, step_indices
from sanarl.training.protocol import per_rank_batch, run_settings, steps_plan
from sanarl.training.sampling import grid_shift


def scheduler_table(shift: float, size: int = SCHEDULER_TABLE_SIZE) -> Tensor:
    """The training scheduler's sigma table [size] (float32, descending): entry k is shift((size - k) / size).

    This is the table FlowMatchEulerDiscreteScheduler builds before any `set_timesteps` (no terminal 0): levels
    1, ..., 1/size of t, each shifted; entry 0 is 1 and entry size - 1 is shift(1 / size)."""
    grid = torch.arange(size, 0, -1, dtype=torch.float32) / size
    return u_to_sigma(grid, shift)


def table_level(t: Tensor, table: Tensor) -> Tensor:
    """HY-SOAR's lookup: index k = trunc((1 - t) size), clamped to [0, size - 1], computed in t's dtype; the
    level is table[k]. Every t in (0, 1] reads the entry of its t rounded up to the grid, t = 0 the last one."""
    size = table.shape[0]
    index = ((1.0 - t) * size).long().clamp(0, size - 1)
    return table.to(device=t.device, dtype=t.dtype)[index]


def aux_model_level(s: Tensor, table: Tensor) -> Tensor:
    """HY-SOAR's model time of auxiliary levels s' [N]: i = the first table entry <= s' (a search in the descending
    table), carried to t = 1 - i / size and read back with `table_level`. The aux rows' velocity sees that level;
    their re-noising, target (z' - z0) / s' and weight w(s') keep s' itself."""
    size = table.shape[0]
    index = torch.searchsorted(-table.to(device=s.device, dtype=s.dtype), -s.contiguous()).clamp(0, size - 1)
    return table_level(1.0 - index.to(s.dtype) / size, table)


def soar_levels(
    u: Tensor, num_sampling_steps: int, shift: float, grid: LevelGrid = "scheduler_table"
) -> tuple[Tensor, Tensor, Tensor]:
    """u [B] -> (s0, s1, active) [B] with t1 = max(u - 1/N, 0) and active = t1 > 0 (docs/algorithms.md, "SOAR").

    grid "scheduler_table" (HY-SOAR): s0, s1 = `table_level` of u, t1 in `scheduler_table(shift)`, so the
    boundary t1 = 0 reads s1 = shift(1/1000) > 0; "continuous": s0 = shift(u), s1 = shift(t1) (0 at the boundary).
    """
    t1 = (u - 1.0 / num_sampling_steps).clamp(min=0.0)
    if grid == "continuous":
        return u_to_sigma(u, shift), u_to_sigma(t1, shift), t1 > 0
    if grid != "scheduler_table":
        raise ValueError(f"unknown SOAR level grid {grid!r}; use one of {', '.join(get_args(LevelGrid))}.")
    table = scheduler_table(shift)
    return table_level(u, table), table_level(t1, table), t1 > 0


def draw_randomness(
    count: int,
    latent: tuple[int, ...],
    v: SOARView,
    shift: float,
    rng: torch.Generator,
) -> dict[str, Tensor]:
    """Every random number of a step's per-rank batch, drawn at once (micro-batch split invariant).

    Returns [B] tensors u, s0, s1, active (bool: t1 > 0), keep_caption (bool, one value for the whole batch);
    noise [B, *latent]; s_prime [B, M, P] (`aux_sigmas` per path); path_noise [B, M - 1, *latent] for the
    stochastic paths; with the scheduler table also table_shift [B] (the shift of its table, every row; `aux_points`
    reads the flow_sde stand-in for s0 = 1 and the aux rows' model level from it, as HY-SOAR).
    """
    soar = v.soar
    base = draw_flow_matching_noise(v.diffusers, count, latent, rng)
    u, noise = base["u"], base["eps"]
    # caption dropout per batch, as HY-SOAR: one draw drops every caption of the rank's batch (rollout included)
    keep = (torch.rand(1, generator=rng) >= v.diffusers.caption_dropout).expand(count).clone()
    s0, s1, active = soar_levels(
        u, soar.num_sampling_steps, shift, soar.level_grid
    )  # the one place levels are drawn
    paths = soar.num_rollout_paths
    s_prime = torch.stack(
        [aux_sigmas(s1, s0, soar.trajectory_length, soar.sigma_upper_ratio, rng) for _ in range(paths)], dim=1
    )
    path_noise = torch.randn((count, paths - 1, *latent), generator=rng)
    extra = {}
    if soar.level_grid == "scheduler_table":
        extra["table_shift"] = torch.full((count,), shift, dtype=torch.float64)
    return extra | {
        "u": u,
        "s0": s0,
        "s1": s1,
        "active": active,
        "keep_caption": keep,
        "noise": noise,
        "s_prime": s_prime,
        "path_noise": path_noise,
    }


@dataclass
class AuxPoints:
    """Auxiliary training points of a micro-batch, ordered (sample, path, point).

    z [N, ...] re-noised rollout points; s [N] their levels s'; target [N, ...] = (z - z0) / s';
    owner [N] (long) the micro-batch row each point comes from; s_model [N] the level the velocity is evaluated at
    (s itself, or `aux_model_level` of s on the scheduler table).
    """

    z: Tensor
    s: Tensor
    target: Tensor
    owner: Tensor
    s_model: Tensor


def path_rows(active: Tensor, path: int, boundary: bool) -> Tensor:
    """Rows (sample indices) that roll out path `path`: the ODE path 0 runs from every sample when `boundary`
    (HY-SOAR), else only from the active ones (t1 > 0); the stochastic paths 1..M-1 only from the active ones."""
    if path == 0 and boundary:
        return torch.arange(active.shape[0], device=active.device)
    return active.nonzero().flatten()


def aux_count(count: int, active: int, paths: int, points: int, boundary: bool) -> int:
    """N_aux of a batch: P points per (sample, path) that `path_rows` lets roll out."""
    return points * (active * paths + ((count - active) if boundary else 0))


def aux_points(
    z0: Tensor,
    z1: Tensor,
    z_s0: Tensor,
    v_cfg: Tensor,
    draws: dict[str, Tensor],
    kind: str,
    noise_scale: float,
    boundary: bool = True,
) -> AuxPoints:
    """Roll out M one-step paths and re-noise P points per path toward the same z1.

    z0, z1, z_s0, v_cfg [B, ...]; draws: s0, s1, active [B], s_prime [B, M, P], path_noise [B, M - 1, ...] and,
    with the scheduler table, table_shift [B] (all on z0's device). Path 0 is Euler, paths 1..M-1 one `kind` step (`sanarl.core.soar_math.soar_step`); the
    rows of each path are `path_rows` (boundary samples keep the ODE path when `boundary`). Points are ordered
    (path, point, row); N = `aux_count`.
    """
    paths, points = draws["s_prime"].shape[1:]
    table = scheduler_table(float(draws["table_shift"][0])) if "table_shift" in draws else None
    first_next = None if table is None else float(table[1])  # HY-SOAR's flow_sde stand-in for s0 = 1
    zs, ss, targets, owners = [], [], [], []
    for m in range(paths):
        idx = path_rows(draws["active"], m, boundary)
        if idx.numel() == 0:
            continue
        s0, s1 = draws["s0"][idx], draws["s1"][idx]
        noise = None if m == 0 else draws["path_noise"][idx, m - 1]
        z1p = soar_step(
            "ode" if m == 0 else kind, z_s0[idx], v_cfg[idx], s0, s1, noise_scale, noise, first_next
        )
        for p in range(points):
            sp = draws["s_prime"][idx, m, p]
            zp = renoise_toward(z1p, z1[idx], s1, sp)
            zs.append(zp)
            ss.append(sp)
            targets.append(corrective_target(zp, z0[idx], sp))
            owners.append(idx)
    if not zs:
        empty = torch.zeros(0, dtype=torch.long, device=z0.device)
        return AuxPoints(z0[:0], draws["s0"][:0], z0[:0], empty, draws["s0"][:0])
    s = torch.cat(ss)
    s_model = s if table is None else aux_model_level(s, table)
    return AuxPoints(torch.cat(zs), s, torch.cat(targets), torch.cat(owners), s_model)


def global_sum(values: list[float], device: torch.device | str) -> list[float]:
    """`values` summed over all ranks (torch.distributed when initialised with more than one rank)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t.tolist()


def loss_scale(n_main: float, n_aux: float, lambda_aux: float, micro: int, world: int) -> float:
    """Factor of a micro-batch's loss sum: K W / max(N_main + lambda_aux N_aux, 1) with global counts.

    The runner divides every micro-batch loss by K and DDP averages over W ranks, so the applied gradient is
    that of the global sum divided by the global normaliser (module docstring)."""
    return micro * world / float(soar_normaliser(n_main, n_aux, lambda_aux))


class SOARBatch(TypedDict, total=False):
    """One SOAR micro-batch: the plugin's collated items, the step's draws (`draw_randomness`) and loss scales."""

    prompt: list[str]
    image: torch.Tensor
    """[B, 3, H, W] in [0, 1]."""
    keep_caption: torch.Tensor
    u: torch.Tensor
    s0: torch.Tensor
    """[B] the main row's level."""
    s1: torch.Tensor
    """[B] the level one rollout step later."""
    active: torch.Tensor
    """[B] bool: t1 > 0 (off the boundary)."""
    noise: torch.Tensor
    """[B, *latent] z1."""
    s_prime: torch.Tensor
    """[B, M, P] auxiliary levels per path."""
    path_noise: torch.Tensor
    """[B, M - 1, *latent] noise of the stochastic paths."""
    table_shift: torch.Tensor
    """[B] the shift of the scheduler table (level_grid = scheduler_table only)."""
    vae_noise: torch.Tensor
    loss_scale: torch.Tensor
    """[B] K W / max(N_main + lambda_aux N_aux, 1), every row the same."""
    main_scale: torch.Tensor
    aux_scale: torch.Tensor


class SOARTask(ItemTask):
    """The `sft` / `soar` task: flow matching plus the self-correction loss on the model's own rollout steps."""

    view: SOARView
    """The sections SOAR reads (its config.py)."""
    method_view = staticmethod(view)

    def __init__(
        self, cfg: Config, adapter: DiffusionAdapter, plugin: DatasetPlugin, *, rank: int = 0, world: int = 1
    ) -> None:
        super().__init__(cfg, adapter, plugin, rank=rank, world=world)
        self.soar = self.view.soar
        self.flow_shift = self.view.diffusers.sample.flow_shift
        self._metrics: dict[str, float] = {}
        self._check_buckets()

    def _check_buckets(self) -> None:
        """Bucketed datasets: some bucket fills a global batch, and every bucket size suits the VAE."""
        ds = self.train_dataset
        if hasattr(ds, "check_batch"):
            ds.check_batch(self.run.batch_per_replica)
        for (height, width), rows in getattr(ds, "buckets", {}).items():
            try:
                self.adapter.latent_shape(height, width)
            except ValueError as err:
                where = ds.describe_row(rows[0]) if hasattr(ds, "describe_row") else f"row {rows[0]}"
                raise DataError(
                    f"{where}: bucket bh x bw = {height} x {width} does not suit the model ({err}); fix `bw` / "
                    "`bh` of its rows (multiples of the VAE factor times the patch size) or drop them."
                ) from None

    def steps_per_epoch(self) -> int:
        ds, batch = self.train_dataset, self.run.batch_per_replica
        if hasattr(ds, "num_batches"):
            return max(1, ds.num_batches(batch))
        return max(1, len(ds) // batch)

    def _items(self, step: int) -> list[dict]:
        ds, per_rank = self.train_dataset, self.per_rank_batch()
        if hasattr(ds, "batch_items"):
            return ds.batch_items(step, self.rank, self.world, per_rank)
        idx = step_indices(len(ds), self.run.seed, step, rank=self.rank, world=self.world, per_rank=per_rank)
        return [ds[i] for i in idx]

    def micro_batches(self, step: int, rng: torch.Generator) -> list[SOARBatch]:
        # 1. this rank's items and every random number of the batch
        batch = self.collate(self._items(step))
        if "image" not in batch:
            raise DataError(
                f"plugin `{self.plugin.__name__}` returned items without an `image` for SOAR; its items are "
                '{"prompt": str, "image": FloatTensor[3,H,W] in [0,1]} (docs/plugins.md).'
            )
        count = len(batch["prompt"])
        latent = self.adapter.latent_shape(*batch["image"].shape[-2:])
        shift = grid_shift(self.adapter, self.flow_shift, *batch["image"].shape[-2:])
        batch.update(draw_randomness(count, latent, self.view, shift, rng))
        batch.update(draw_vae_noise(self.adapter, count, latent, rng))
        # 2. the step's point counts over all ranks -> one loss scale for every micro-batch
        soar, mini = self.soar, self.run.mini_batch
        n_active = int(batch["active"].sum())
        local_aux = aux_count(
            count, n_active, soar.num_rollout_paths, soar.trajectory_length, soar.boundary_aux_points
        )
        n_main, n_aux, n_edge = global_sum([count, local_aux, count - n_active], self.adapter.device)
        micro = -(-count // mini)
        scale = loss_scale(n_main, n_aux, soar.lambda_aux, micro, self.world)
        batch["loss_scale"] = torch.full((count,), scale, dtype=torch.float64)
        batch["main_scale"] = torch.full((count,), micro / count, dtype=torch.float64)
        batch["aux_scale"] = torch.full((count,), micro / max(local_aux, 1), dtype=torch.float64)
        self._metrics = {"num_aux_points": n_aux, "boundary_fraction": n_edge / max(n_main, 1.0)}
        return split_batch(batch, mini)

    def collect_metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    @torch.no_grad()
    def rollout_velocity(self, z: Tensor, s: Tensor, cond: Cond) -> Tensor:
        """v_cfg = v_u + w (v_c - v_u) with the current weights, no grad, on the unwrapped transformer."""
        w = self.soar.cfg_scale_sampling
        uncond = self.adapter.uncond_for(w)
        return self.adapter.guided_velocity(z, s, cond, uncond, w, module=self.adapter.transformer)

    def _cond(self, batch: dict) -> Cond:
        """The captions' cond, caption dropout applied (the rollout and the trained forwards use the same one)."""
        return self.adapter.encode_captions(batch["prompt"], batch["keep_caption"].tolist())

    def objective(self, batch: SOARBatch, rng: torch.Generator) -> tuple[Tensor, dict[str, float]]:
        adapter, soar = self.adapter, self.soar
        # 3. the main row z_s0 on the straight path from z0 to z1
        z0 = encode_media(adapter, batch["image"], batch)
        keys = ("s0", "s1", "active", "s_prime", "path_noise", "table_shift")
        draws = {k: batch[k].to(z0.device) for k in keys if k in batch}
        z1 = batch["noise"].to(z0.device)
        s0 = draws["s0"]
        z_s0 = interpolate(z0, z1, s0)
        cond = self._cond(batch)
        # 4. the rollout velocity: current weights, CFG, no grad
        v_cfg = self.rollout_velocity(z_s0, s0, cond)
        # 5. auxiliary points: one step s0 -> s1 per path, re-noised toward z1 at s', with corrective targets
        aux = aux_points(
            z0, z1, z_s0, v_cfg, draws, soar.sde_rollout_type, soar.sde_noise_scale, soar.boundary_aux_points
        )
        # 6. one forward over the main and auxiliary rows
        x = torch.cat([z_s0, aux.z])
        s = torch.cat(
            [s0, aux.s_model]
        )  # the model's level of each row (aux: `aux_model_level` on the table)
        v = adapter.velocity(x, s, Cond.cat([cond, cond.select(aux.owner)]))
        err = (v - torch.cat([velocity_target(z0, z1), aux.target])).pow(2).flatten(1).mean(1)
        # 7. weighted sums, normalised by the step's global counts
        count, scheme = z0.shape[0], self.view.diffusers.weighting_scheme
        main_sum = (loss_weight(scheme, s0) * err[:count]).sum()
        aux_sum = (loss_weight(scheme, aux.s) * err[count:]).sum()  # w(s'), as HY-SOAR
        loss = (main_sum + soar.lambda_aux * aux_sum) * float(batch["loss_scale"][0])
        return loss, {
            "loss": loss.item(),
            "loss_main": main_sum.item() * float(batch["main_scale"][0]),
            "loss_aux": aux_sum.item() * float(batch["aux_scale"][0]),
            "sigma_mean": s0.mean().item(),
        }

    @staticmethod
    def describe(cfg: Config, dataset_size: int, world: int) -> list[tuple[str, str]]:
        """The batch arithmetic and the SOAR point counts, without loading a model (`sanarl validate`)."""
        run, soar = run_settings(cfg), view(cfg).soar
        bpr, mb = run.batch_per_replica, run.mini_batch
        per_rank = per_rank_batch(run, world)
        per_epoch = max(1, dataset_size // bpr)
        points = soar.num_rollout_paths * soar.trajectory_length
        return [
            ("dataset items", str(dataset_size)),
            ("batch per step", f"{bpr} (train_batch_per_replica) / {world} rank(s) = {per_rank} per rank"),
            ("micro-batches", f"{per_rank} / mini_batch {mb} = {per_rank // mb} per rank per step"),
            (
                "steps",
                steps_plan(run, per_epoch, " (bucketed data: fewer, each bucket's remainder sits out)"),
            ),
            (
                "SOAR points",
                f"1 main + {soar.num_rollout_paths} path(s) x {soar.trajectory_length} = {points} aux per sample "
                f"({soar.trajectory_length if soar.boundary_aux_points else 0} at the t1 = 0 boundary); trained rows per micro-batch <= {mb * (1 + points)}, plus "
                f"{2 * mb if soar.cfg_scale_sampling != 1.0 else mb} no-grad CFG rows",
            ),
            (
                "loss",
                f"(L_main + {soar.lambda_aux} L_aux) / max(N_main + {soar.lambda_aux} N_aux, 1), counts over ranks",
            ),
        ]
