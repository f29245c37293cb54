"""The reward-hacking alarm (`[validation.guard]`, docs/shapes.md "Reward-hacking alarm").

At every validation the runner hands the guard the validation metrics (`heldout/<reward>/<key>` of the rewards the
run does not train on, and `heldout/image/<stat>` image statistics of the same samples). A guard metric's *best*
validation is the one where it is best so far (earliest on ties). The alarm fires at a validation when, for some
guard metric, the value is worse than its best by more than `margin` AND the trained reward rose: its mean over the
steps before this validation exceeds its value at the best validation by more than `min_trained_rise` (the trained
reward of a validation = the mean of `trained_metric` over the steps since the previous validation; for the first,
before any step, the steps up to the next one). The guard keeps a checkpoint of every metric's best validation
(`<run>/guard/step_*`), so `action = "stop"` can stop the run and export that one (rollback); with `rollback =
"last_clean"` it also keeps the newest *clean* validation (no metric worse than its best so far by more than its
margin: the alarm's test without the trained-reward condition) and exports that one instead. Every alarm writes
`guard/alarm_step_*.png` (top row the best validation's samples, bottom row the current ones) and `guard/alarm.json`.

`find_alarm` is the pure decision; `Guard` the state the runner keeps (runner.py calls `record_step`, `observe`,
`decide`, `keep_checkpoint`, `best_checkpoint`). The history survives a resume: every training checkpoint holds
`guard.pt` (`Guard.checkpoint_state`: steps, values, the trained-reward series, the alarm, and the first
`GRID_SAMPLES` samples of each metric's best validation as uint8, all the alarm grid draws, and the first
validation's hue histogram that `heldout/image/colour_shift` is measured from), which the resumed run
loads up to the checkpoint's step (`Guard.load_checkpoint_state`) after removing what the run left under guard/ past
it (`forget_after`). The kept `guard/step_*` of the newest training checkpoint's bests stay until the next training
checkpoint, even when a later validation beats them, so a run resumed from it can still roll back to them.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from sanarl.config.schema import GuardConfig, GuardMetricConfig
from sanarl.core.media import save_media
from sanarl.errors import ConfigError
from sanarl.training.run_folder.checkpoint_store import checkpoint_name, list_checkpoints, save_checkpoint
from sanarl.training.run_folder.run_files import write_file

IMAGE_PREFIX = "heldout/image/"
GRID_SAMPLES = 8
"""Samples per row of the alarm grid: all a checkpoint keeps of a validation's samples."""
ENTROPY_LEVELS = 8
"""Levels per RGB channel of the colour histogram of `heldout/image/entropy` (the shapes judge's `entropy` too)."""
HUE_BINS = 6
"""Hue bins of the colour histogram of `heldout/image/colour_shift`: 60 degrees each, centred on red, yellow, green,
cyan, blue and magenta (a colour near a bin's centre does not split between two bins as its hue jitters)."""
CHROMA_FLOOR = 0.25
"""A pixel has a hue when its HSV saturation and value are both at least this."""


@dataclass(frozen=True)
class Alarm:
    """A guard metric worse than its best by more than its margin while the trained reward rose."""

    key: str
    step: int
    value: float
    best_step: int
    best: float
    margin: float
    trained_now: float
    trained_best: float

    @property
    def worsening(self) -> float:
        return abs(self.value - self.best)

    def message(self, trained_metric: str) -> str:
        rise = (
            f" while {trained_metric} rose {self.trained_best:.4g} -> {self.trained_now:.4g}"
            if trained_metric
            else ""
        )
        return (
            f"guard: {self.key} worsened from {self.best:.4g} (best, step {self.best_step}) to {self.value:.4g} at "
            f"step {self.step}, by {self.worsening:.4g} > margin {self.margin:g}{rise}"
        )


def image_guard_stats(images: torch.Tensor, base_hue: torch.Tensor | None = None) -> dict[str, float]:
    """Statistics of validation samples `[B, 3, ...]` in [0, 1] (video clips `[B, 3, T, H, W]` too), keyed
    `heldout/image/<stat>`: mean brightness (Rec. 601 luma), HSV saturation ((max - min) / max over RGB), colour
    entropy (`colour_entropy`, the mean over samples) and colour shift (`histogram_shift` of the samples' pooled
    `hue_histogram` from `base_hue`; 0 without one)."""
    x = images.detach().float().clamp(0, 1)
    weights = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, *([1] * (x.ndim - 2)))
    luma = (x * weights).sum(dim=1)
    high, low = x.max(dim=1).values, x.min(dim=1).values
    saturation = torch.where(high > 0, (high - low) / high.clamp_min(1e-12), torch.zeros_like(high))
    hue = hue_histogram(x)
    return {
        f"{IMAGE_PREFIX}brightness": float(luma.mean()),
        f"{IMAGE_PREFIX}saturation": float(saturation.mean()),
        f"{IMAGE_PREFIX}entropy": float(colour_entropy(x).mean()),
        f"{IMAGE_PREFIX}colour_shift": histogram_shift(hue, hue if base_hue is None else base_hue),
    }


def colour_entropy(images: torch.Tensor) -> torch.Tensor:
    """Per sample `[B]`: the Shannon entropy (bits) of its colour histogram with ENTROPY_LEVELS levels per RGB
    channel (512 bins): 0 for one flat colour, 1 for two colours in equal parts, ~9 for uniform noise. Specks and
    texture raise it; images `[B, 3, ...]` in [0, 1]."""
    levels = ENTROPY_LEVELS
    q = (images.detach().float().clamp(0, 1) * levels).long().clamp(max=levels - 1)
    bins = (q[:, 0] * levels + q[:, 1]) * levels + q[:, 2]
    flat = bins.reshape(bins.shape[0], -1)
    counts = torch.zeros(flat.shape[0], levels**3).scatter_add_(1, flat, torch.ones(flat.shape))
    p = counts / flat.shape[1]
    return -(p * torch.log2(p.clamp_min(1e-30))).sum(dim=1)


def hue_histogram(images: torch.Tensor) -> torch.Tensor:
    """Pixel counts `[HUE_BINS]` of the HSV hue (bins of 360 / HUE_BINS degrees, the first centred on red) over the
    chromatic pixels (saturation and value (max over RGB) both >= CHROMA_FLOOR) of all samples `[B, 3, ...]` in
    [0, 1]; grey, white and dark pixels have no hue and are not counted."""
    x = images.detach().float().clamp(0, 1).movedim(1, -1).reshape(-1, 3)
    high, low = x.max(dim=1).values, x.min(dim=1).values
    delta = high - low
    chromatic = (high >= CHROMA_FLOOR) & (delta >= CHROMA_FLOOR * high)
    r, g, b = x[chromatic].unbind(dim=1)
    h, d = high[chromatic], delta[chromatic]
    sixths = torch.where(
        r == h, torch.remainder((g - b) / d, 6.0), torch.where(g == h, (b - r) / d + 2.0, (r - g) / d + 4.0)
    )
    index = torch.remainder(torch.floor(sixths * HUE_BINS / 6.0 + 0.5), HUE_BINS).long()
    return torch.bincount(index, minlength=HUE_BINS).float()


def histogram_shift(counts: torch.Tensor, base: torch.Tensor) -> float:
    """Total variation distance between two histograms (each normalised to sum 1): half the L1 distance, 0 for the
    same distribution, 1 for disjoint ones; 0 when both are empty, 1 when one of them is."""
    total, base_total = float(counts.sum()), float(base.sum())
    if total == 0 or base_total == 0:
        return 0.0 if total == base_total else 1.0  # both empty, or only one
    return 0.5 * float((counts / total - base / base_total).abs().sum())


def window_mean(series: Sequence[tuple[int, float]], after: float, upto: float) -> float:
    """Mean of the finite values of (step, value) pairs with after < step <= upto; NaN when there are none."""
    vals = [v for s, v in series if after < s <= upto and math.isfinite(v)]
    return math.fsum(vals) / len(vals) if vals else math.nan


def trained_at(series: Sequence[tuple[int, float]], steps: Sequence[int], i: int) -> float:
    """The trained reward of validation i (at steps[i]): the mean over the steps since the previous validation, or,
    when no step came before it (a validation before training), over the steps up to the next validation."""
    value = window_mean(series, steps[i - 1] if i > 0 else -math.inf, steps[i])
    if math.isnan(value) and i + 1 < len(steps):
        value = window_mean(series, steps[i], steps[i + 1])
    return value


def best_index(values: Sequence[float], worse: str) -> int | None:
    """Index of the best finite value (the lowest when `worse` = "higher", else the highest; earliest on ties)."""
    finite = [(v, i) for i, v in enumerate(values) if math.isfinite(v)]
    if not finite:
        return None
    sign = 1.0 if worse == "higher" else -1.0
    return min(finite, key=lambda vi: (sign * vi[0], vi[1]))[1]


def worse_than_best(series: Sequence[float], i: int, best: int, worse: str) -> float:
    """How much worse value i is than the best value (positive: worse), in the metric's `worse` direction."""
    return (series[i] - series[best]) * (1.0 if worse == "higher" else -1.0)


def find_alarm(
    steps: Sequence[int],
    values: Mapping[str, Sequence[float]],
    rules: Sequence[GuardMetricConfig],
    trained: Sequence[tuple[int, float]] | None,
    min_trained_rise: float = 0.0,
) -> Alarm | None:
    """The alarm at the last validation (steps[-1]), or None.

    `values[key][i]` is guard metric `key` at validation i; `trained` the (step, trained reward) series, None to
    fire on the guard metrics alone. The first rule (in config order) that fires is returned.
    """
    last = len(steps) - 1
    for rule in rules:
        series = values.get(rule.key, [])
        best = best_index(series, rule.worse)
        if best is None or best == last or not math.isfinite(series[last]):
            continue
        if not worse_than_best(series, last, best, rule.worse) > rule.margin:
            continue
        now = trained_at(trained, steps, last) if trained is not None else math.nan
        then = trained_at(trained, steps, best) if trained is not None else math.nan
        if trained is not None and not now - then > min_trained_rise:  # NaN: the rise is not shown
            continue
        return Alarm(rule.key, steps[last], series[last], steps[best], series[best], rule.margin, now, then)
    return None


def is_clean(values: Mapping[str, Sequence[float]], rules: Sequence[GuardMetricConfig], i: int) -> bool:
    """Validation i is clean when no guard metric is worse than its best over validations 0..i by more than its
    margin (a value that is not finite is not shown worse). The first validation is always clean."""
    for rule in rules:
        series = list(values.get(rule.key, []))[: i + 1]
        best = best_index(series, rule.worse)
        if best is None or not math.isfinite(series[i]):
            continue
        if worse_than_best(series, i, best, rule.worse) > rule.margin:
            return False
    return True


def check_reward_keys(cfg: GuardConfig, rewards: Mapping[str, object]) -> None:
    """Before training: every `heldout/<reward>/<key>` guard key names a key that built reward returns.

    Raises:
        ConfigError: naming the guard key and the reward's keys.
    """
    for i, rule in enumerate(cfg.metrics):
        _, name, key = rule.key.split("/", 2)
        keys = getattr(rewards.get(name), "keys", None)
        if name != "image" and keys is not None and key not in keys:
            raise ConfigError(
                f"`validation.guard.metrics[{i}].key` = {rule.key!r}: reward {name!r} returns the keys "
                f"{list(keys)}, not {key!r}; use one of `heldout/{name}/<key>` with those."
            )


class Guard:
    """The alarm's state in one run (rank 0 observes and decides; every rank takes part in `keep_checkpoint`'s
    gather through the runner)."""

    def __init__(self, cfg: GuardConfig, run_dir: Path) -> None:
        self.cfg, self.root = cfg, run_dir / "guard"
        self.steps: list[int] = []
        self.values: dict[str, list[float]] = {m.key: [] for m in cfg.metrics}
        self.trained: list[tuple[int, float]] = []
        self.samples: dict[int, tuple[torch.Tensor, list[str]]] = {}
        self.alarm: Alarm | None = None
        self.step_keys: set[str] = set()
        # the kept validations of the newest training checkpoint: their guard/step_* stay until the next one
        self.saved_best: set[int] = set()
        self.base_hue: torch.Tensor | None = None
        """The hue histogram of the run's first validation (the base when `validation.val_before_train`)."""

    def image_metrics(self, images: torch.Tensor) -> dict[str, float]:
        """`image_guard_stats` of a validation's samples; the first validation's hue histogram becomes the base
        that `heldout/image/colour_shift` is measured from."""
        if self.base_hue is None:
            self.base_hue = hue_histogram(images)
        return image_guard_stats(images, self.base_hue)

    def record_step(self, step: int, metrics: Mapping[str, float]) -> None:
        """Keep the trained reward of optimizer step `step`."""
        key = self.cfg.trained_metric
        self.step_keys.update(metrics)
        if key and metrics.get(key) is not None:
            self.trained.append((step, float(metrics[key])))

    def observe(
        self, step: int, images: torch.Tensor, prompts: list[str], logged: Mapping[str, float]
    ) -> None:
        """The validation at `step`: its logged metrics and samples (kept while they are some metric's best).

        Raises:
            ConfigError: a guard key the validation did not log, naming the keys it did log.
        """
        missing = [k for k in self.values if k not in logged]
        if missing:
            raise ConfigError(
                f"`validation.guard.metrics` key(s) {missing} were not logged by the validation; it logged "
                f"{sorted(logged)}. Use one of those keys."
            )
        self.steps.append(step)
        for key in self.values:
            self.values[key].append(float(logged[key]))
        self.samples[step] = (images.detach().cpu(), list(prompts))

    def best_steps(self) -> set[int]:
        """The validation step that is each guard metric's best so far."""
        found = set()
        for rule in self.cfg.metrics:
            i = best_index(self.values[rule.key], rule.worse)
            if i is not None:
                found.add(self.steps[i])
        return found

    def last_clean_step(self, before: int | None = None) -> int | None:
        """The newest clean validation (`is_clean`), only those before step `before` when given."""
        for i in reversed(range(len(self.steps))):
            if (before is None or self.steps[i] < before) and is_clean(self.values, self.cfg.metrics, i):
                return self.steps[i]
        return None

    def kept_steps(self) -> set[int]:
        """The validations whose checkpoints the guard keeps: each metric's best, and with `rollback =
        "last_clean"` the newest clean one."""
        kept = self.best_steps()
        clean = self.last_clean_step() if self.cfg.rollback == "last_clean" else None
        return kept if clean is None else kept | {clean}

    def rollback_step(self) -> int | None:
        """The validation a stop exports (`rollback`): the alarm metric's best, or the newest clean validation
        before the alarm (the alarm's best when none is kept)."""
        if self.alarm is None:
            return None
        if self.cfg.rollback == "last_clean":
            clean = self.last_clean_step(before=self.alarm.step)
            if clean is not None:
                return clean
        return self.alarm.best_step

    def decide(self, step: int, logger=None) -> tuple[bool, bool]:
        """After `observe(step)`: (keep a checkpoint of this step, stop the run). An alarm is logged (`guard/alarm`),
        drawn (`guard/alarm_step_*.png`) and recorded (`guard/alarm.json`)."""
        trained = self.trained if self.cfg.trained_metric else None
        if trained is not None and not trained and self.step_keys:
            raise ConfigError(
                f"`validation.guard.trained_metric` = {self.cfg.trained_metric!r} is not a metric this run logs per "
                f'step ({", ".join(sorted(self.step_keys))}); set it to one of those, or to "" to fire on the guard '
                "metrics alone."
            )
        alarm = find_alarm(self.steps, self.values, self.cfg.metrics, trained, self.cfg.min_trained_rise)
        best, kept = self.best_steps(), self.kept_steps()
        self.samples = {s: v for s, v in self.samples.items() if s in best or s == step}
        if logger is not None:
            logger.log(step, {"guard/alarm": float(alarm is not None)})
        if alarm is None:
            return step in kept, False
        self.alarm = alarm
        grid = self._write_alarm(alarm)
        if logger is not None and grid is not None:
            logger.log_image(step, "guard/alarm", grid)
        return step in kept, self.cfg.action == "stop"

    def _write_alarm(self, alarm: Alarm) -> Path | None:
        """guard/alarm.json (every alarm so far) and the best-vs-current grid of this one."""
        self.root.mkdir(parents=True, exist_ok=True)
        record = self.root / "alarm.json"
        history = json.loads(record.read_text()) if record.is_file() else []
        entry = {
            **asdict(alarm),
            "message": alarm.message(self.cfg.trained_metric),
            "action": self.cfg.action,
        }
        write_file(record, json.dumps([*history, entry], indent=2) + "\n")
        if alarm.best_step not in self.samples or alarm.step not in self.samples:
            return None
        (best, prompts), (now, _) = self.samples[alarm.best_step], self.samples[alarm.step]
        k = min(GRID_SAMPLES, best.shape[0], now.shape[0])
        captions = [f"step {alarm.best_step} (best): {p}" for p in prompts[:k]]
        captions += [f"step {alarm.step}: {p}" for p in prompts[:k]]
        stem = self.root / f"alarm_{checkpoint_name(alarm.step)}"
        return save_media(torch.cat([best[:k], now[:k]]), captions, stem, columns=k)

    def keep_checkpoint(self, step: int, tensors: dict[str, dict[str, torch.Tensor]]) -> Path:
        """Write the weights of validation `step` (a metric's new best, or the newest clean one) and drop kept ones
        nothing needs now."""
        path = save_checkpoint(self.root, step, tensors, {}, {"guard": "kept validation"})
        best = self.kept_steps() | self.saved_best
        for old in list_checkpoints(self.root):
            if _step_of(old.name) not in best:
                shutil.rmtree(old, ignore_errors=True)
        return path

    def best_checkpoint(self) -> Path | None:
        """The kept checkpoint of `rollback_step` (what a stop exports), or None."""
        step = self.rollback_step()
        if step is None:
            return None
        path = self.root / checkpoint_name(step)
        return path if (path / "meta.json").is_file() else None

    # --- resume -------------------------------------------------------------------------------------------------
    def checkpoint_state(self) -> dict[str, Any]:
        """The history so far, for the training checkpoint being written (torch `weights_only` loadable): validation
        steps, guard values, the trained-reward series with its metric's name, the per-step metric keys, the alarm,
        and the first GRID_SAMPLES samples (uint8, as the grid draws them) and prompts of each metric's best
        validation. The kept checkpoints of those bests stay until the next training checkpoint."""
        best = self.saved_best = self.kept_steps()
        samples = {
            step: {"images": _to_uint8(images[:GRID_SAMPLES]), "prompts": prompts[:GRID_SAMPLES]}
            for step, (images, prompts) in self.samples.items()
            if step in best
        }
        return {
            "steps": list(self.steps),
            "values": {key: list(values) for key, values in self.values.items()},
            "trained_metric": self.cfg.trained_metric,
            "trained": list(self.trained),
            "step_keys": sorted(self.step_keys),
            "alarm": None if self.alarm is None else asdict(self.alarm),
            "samples": samples,
            "base_hue": self.base_hue,
        }

    def load_checkpoint_state(self, state: Mapping[str, Any], upto: int) -> None:
        """Continue from `checkpoint_state()`, keeping what happened at steps <= `upto` (the resumed checkpoint's
        step). A metric the saved run did not watch has no value (NaN) at its validations; a changed
        `trained_metric` starts the trained-reward series afresh."""
        kept = [i for i, step in enumerate(state["steps"]) if step <= upto]
        saved = state["values"]
        self.steps = [int(state["steps"][i]) for i in kept]
        self.values = {
            key: [float(saved[key][i]) if key in saved else math.nan for i in kept] for key in self.values
        }
        same_metric = state["trained_metric"] == self.cfg.trained_metric
        self.trained = [(int(s), float(v)) for s, v in state["trained"] if s <= upto] if same_metric else []
        self.step_keys = set(state["step_keys"])
        alarm = state["alarm"]
        self.alarm = Alarm(**alarm) if alarm is not None and alarm["step"] <= upto else None
        self.samples = {
            int(step): (kept_["images"].float() / 255.0, list(kept_["prompts"]))
            for step, kept_ in state["samples"].items()
            if step <= upto
        }
        self.saved_best = self.kept_steps()
        self.base_hue = state.get("base_hue") if self.steps else None

    def forget_after(self, step: int) -> None:
        """Remove what the run left under guard/ past `step` (kept checkpoints, alarm grids, alarm.json entries):
        a run resumed at `step` validates those steps again."""
        for old in list_checkpoints(self.root):
            if _step_of(old.name) > step:
                shutil.rmtree(old, ignore_errors=True)
        for grid in self.root.glob("alarm_step_*"):
            if _step_of(grid.stem) > step:
                grid.unlink()
        record = self.root / "alarm.json"
        if record.is_file():
            entries = [e for e in json.loads(record.read_text()) if e["step"] <= step]
            write_file(record, json.dumps(entries, indent=2) + "\n")


def _step_of(name: str) -> int:
    """The step of a `…step_NNNNNNNN` file or directory name."""
    return int(name.rsplit("_", 1)[-1])


def _to_uint8(images: torch.Tensor) -> torch.Tensor:
    """Images in [0, 1] as uint8, rounded as the saved grids round them."""
    return images.detach().float().clamp(0, 1).mul(255).round().to(torch.uint8).cpu()
