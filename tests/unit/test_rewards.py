"""Reward library core: interface checks, registry, JPEG and shapes rewards, the multi-reward RewardFunction."""

from __future__ import annotations

import importlib
import io
import sys
import threading

import numpy as np
import pytest
import torch
from PIL import Image

from sanarl.config.schema import Config, RemoteRewardConfig, RewardFnConfig
from sanarl.errors import ConfigError, DataError, PluginError, UserError
from sanarl.rewards import (
    Reward,
    RewardFailure,
    RewardFunction,
    RewardInputError,
    build_reward,
    known_rewards,
    register,
    register_lazy,
    to_uint8_hwc,
    unregister,
)
from sanarl.rewards.scorers.jpeg import jpeg_kilobytes
from sanarl.rewards.scorers.shapes import ShapesReward
from sanarl.worlds import shapes as world

# ---------------------------------------------------------------- helpers


class TableReward(Reward):
    """Returns fixed per-sample values (or raises), counting `_load` calls."""

    name = "table"
    keys = ("a", "b")
    default_key = "a"

    def __init__(self, a: list[float] | None = None, b: list[float] | None = None, error: str = "") -> None:
        super().__init__()
        self.a, self.b, self.error, self.loads = a, b, error, 0

    def _load(self) -> None:
        self.loads += 1

    def _score(self, images, prompts, metadata):
        if self.error:
            raise ValueError(self.error)
        n = images.shape[0]
        a = self.a if self.a is not None else images.mean(dim=(1, 2, 3)).double().tolist()
        b = self.b if self.b is not None else [float(len(p)) for p in prompts]
        return {"a": a[:n], "b": torch.tensor(b[:n], dtype=torch.float64)}


def shapes_row(tag: str, index: int = 0) -> dict:
    return world.list_prompts("train")[tag][index]


def rendered(rows: list[dict], size: int = 32) -> torch.Tensor:
    """Ground-truth renders of metadata rows as [B, 3, H, W] float in [0, 1]."""
    arrays = [world.render(row, size, seed=i) for i, row in enumerate(rows)]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 255.0


def blank(n: int, size: int = 32) -> torch.Tensor:
    """Images that are pure shapes-world background."""
    bg = torch.tensor(world.BACKGROUND, dtype=torch.float32) / 255.0
    return bg.view(1, 3, 1, 1).expand(n, 3, size, size).clone()


def reward_config(*fns: RewardFnConfig, **kwargs) -> RemoteRewardConfig:
    return RemoteRewardConfig(reward_fns=list(fns), **kwargs)


# ---------------------------------------------------------------- input contract


@pytest.mark.parametrize(
    ("images", "needle"),
    [
        (torch.rand(2, 32, 32, 3), "permute(0, 3, 1, 2)"),
        ((torch.rand(2, 3, 8, 8) * 255).to(torch.uint8), "images.float() / 255"),
        (torch.rand(2, 3, 8, 8) * 2 - 1, "(images + 1) / 2"),
        (torch.rand(2, 3, 8, 8) * 1.5, "values in [0, 1]"),
        (np.zeros((2, 3, 8, 8), dtype=np.float32), "not a torch.Tensor"),
        (torch.rand(0, 3, 8, 8), "empty batch"),
    ],
)
def test_bad_images_raise_a_user_error_with_the_fix(images, needle: str) -> None:
    with pytest.raises(RewardInputError) as err:
        TableReward().score(images, ["p", "q"])
    assert isinstance(err.value, DataError) and isinstance(err.value, ValueError)
    assert isinstance(err.value, UserError) and err.value.exit_code == 2
    assert needle in str(err.value) and "'table'" in str(err.value)


def test_count_mismatches_are_named() -> None:
    reward, images = TableReward(), torch.rand(3, 3, 4, 4)
    with pytest.raises(RewardInputError, match="3 images but 2 prompts"):
        reward.score(images, ["a", "b"])
    with pytest.raises(RewardInputError, match="list of strings"):
        reward.score(images, "abc")
    with pytest.raises(RewardInputError, match="3 images but metadata 1"):
        reward.score(images, ["a", "b", "c"], [{}])
    with pytest.raises(RewardInputError, match="must be a dict"):
        reward.score(images, ["a", "b", "c"], [{}, {}, "x"])


def test_round_off_outside_unit_range_is_clamped_not_rejected() -> None:
    images = torch.full((1, 3, 2, 2), 1.0 + 5e-5)
    images[0, 0, 0, 0] = -5e-5
    scores = TableReward().score(images, ["p"])
    # mean of the clamped image: 11 pixels at 1.0 and one at 0.0
    assert scores["a"].item() == pytest.approx(11 / 12)


def test_output_is_float32_cpu_and_keeps_every_key() -> None:
    scores = TableReward(a=[1.5, -2.0]).score(torch.zeros(2, 3, 4, 4), ["ab", "abcd"])
    assert scores["a"].dtype == torch.float32 and scores["a"].tolist() == [1.5, -2.0]
    assert scores["b"].dtype == torch.float32 and scores["b"].tolist() == [2.0, 4.0]
    assert not scores["a"].requires_grad


def test_bad_outputs_are_caught() -> None:
    class Missing(TableReward):
        keys = ("a", "b", "c")

    with pytest.raises(KeyError, match=r"did not return \['c'\]"):
        Missing().score(torch.zeros(1, 3, 4, 4), ["p"])

    class WrongShape(TableReward):
        def _score(self, images, prompts, metadata):
            return {"a": torch.zeros(3), "b": torch.zeros(2, 1)}

    with pytest.raises(ValueError, match=r"key 'a' with shape \(3,\), expected \[2\]"):
        WrongShape().score(torch.zeros(2, 3, 4, 4), ["p", "q"])


def test_non_finite_images_get_nan_scores_and_do_not_touch_the_others() -> None:
    images = torch.rand(3, 3, 4, 4)
    alone = TableReward().score(images[[0, 2]], ["x", "zz"])
    images[1, 2, 1, 1] = float("nan")
    scores = TableReward().score(images, ["x", "y", "zz"])
    assert torch.isnan(scores["a"][1]) and torch.isnan(scores["b"][1])
    assert scores["a"][[0, 2]].tolist() == alone["a"].tolist()
    assert scores["b"][[0, 2]].tolist() == [1.0, 2.0]


def test_a_checked_batch_is_not_read_again_until_it_changes(monkeypatch) -> None:
    """check_images reads the pixels once (one aminmax); a batch it returned is not read again by a second check
    or by score's finiteness test, but a write into it (version counter) makes the next check read it again."""
    from sanarl.rewards import base

    passes = []
    real = torch.Tensor.aminmax
    monkeypatch.setattr(torch.Tensor, "aminmax", lambda self, **kw: passes.append(1) or real(self, **kw))
    images = base.check_images(torch.rand(2, 3, 4, 4), "t")
    assert len(passes) == 1 and base.check_images(images, "t") is images and len(passes) == 1
    scores = TableReward().score(images, ["x", "y"])
    assert len(passes) == 1 and not torch.isnan(scores["a"]).any()
    images[1, 0, 0, 0] = float("nan")  # in place: the memo no longer holds
    scores = TableReward().score(images, ["x", "y"])
    assert len(passes) == 2 and torch.isnan(scores["a"][1]) and not torch.isnan(scores["a"][0])
    images[0, 0, 0, 0] = 3.0
    with pytest.raises(RewardInputError, match=r"values in \[0, 1\], got values in \[.*, 3\]"):
        base.check_images(images, "t")


def test_pixels_decoded_from_uint8_are_scored_without_a_range_pass(monkeypatch) -> None:
    """from_uint8 (the reward service worker's decode) is x / 255 to the bit, and in [0, 1] by construction: the
    reward's check and finiteness test do not read it; a write into it makes the next check read it again."""
    from sanarl.rewards import base

    pixels = torch.randint(0, 256, (2, 4, 4, 3), dtype=torch.uint8).permute(0, 3, 1, 2)
    passes = []
    real = torch.Tensor.aminmax
    monkeypatch.setattr(torch.Tensor, "aminmax", lambda self, **kw: passes.append(1) or real(self, **kw))
    images = base.from_uint8(pixels)
    assert torch.equal(images, pixels.to(torch.float32) / 255.0) and images.dtype == torch.float32
    assert base.check_images(images, "t") is images and not passes
    assert not torch.isnan(TableReward().score(images, ["x", "y"])["a"]).any() and not passes
    images[0, 0, 0, 0] = 2.0
    with pytest.raises(RewardInputError, match=r"got values in \[.*, 2\]"):
        base.check_images(images, "t")
    with pytest.raises(TypeError, match="uint8"):
        base.from_uint8(images)


def test_reward_function_scores_non_finite_samples_as_dropped_after_its_own_check() -> None:
    fn = RewardFunction(reward_config(RewardFnConfig(name="jpeg_compressibility")))
    images = torch.rand(3, 3, 16, 16)
    images[2, 1, 3, 3] = float("inf")
    result = fn(images, ["a", "b", "c"], None)
    assert result.nan_mask.tolist() == [False, False, True]
    expected = -jpeg_kilobytes(images[:2], 95) / 500
    assert result.total[:2].tolist() == pytest.approx(expected.tolist())


def test_model_loads_once_even_from_several_threads() -> None:
    reward = TableReward()
    threads = [threading.Thread(target=reward.score, args=(torch.zeros(1, 3, 2, 2), ["p"])) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reward.setup("cpu")
    assert reward.loads == 1


def test_to_uint8_hwc_rounds_by_hand() -> None:
    x = torch.tensor([0.0, 0.2, 0.5, 1.0]).view(1, 1, 2, 2).expand(1, 3, 2, 2)
    out = to_uint8_hwc(x)
    assert out.dtype == np.uint8 and out.shape == (1, 2, 2, 3)
    # 0.2 * 255 = 51.0; 0.5 * 255 = 127.5 -> 128 (round half to even)
    assert out[0, :, :, 1].tolist() == [[0, 51], [128, 255]]


# ---------------------------------------------------------------- registry


def test_builtins_are_known_and_importing_the_package_loads_no_reward_module(monkeypatch) -> None:
    assert {"jpeg_compressibility", "jpeg_incompressibility", "shapes"} <= set(known_rewards())
    import sanarl

    # re-import sanarl.rewards from scratch (torch is already loaded, so this is fast); monkeypatch restores the
    # original modules afterwards
    monkeypatch.setattr(sanarl, "rewards", sanarl.rewards)
    for name in [m for m in sys.modules if m.startswith("sanarl.rewards")]:
        monkeypatch.delitem(sys.modules, name)
    before = set(sys.modules)
    fresh = importlib.import_module("sanarl.rewards")
    assert fresh.known_rewards() == known_rewards()
    new = set(sys.modules) - before
    assert "sanarl.rewards.registry" in new
    assert not [m for m in new if m.split(".")[0] in ("torchvision", "open_clip", "transformers")]
    assert not {"sanarl.rewards.scorers.jpeg", "sanarl.rewards.scorers.shapes"} & new


def test_unknown_reward_lists_known_names_and_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        build_reward("jpeg_compresibility")
    msg = str(err.value)
    assert "`train.train_policy.remote_reward.reward_fns` entry `name = 'jpeg_compresibility'`" in msg
    assert "Did you mean 'jpeg_compressibility'?" in msg
    assert all(name in msg for name in ("jpeg_compressibility", "jpeg_incompressibility", "shapes"))


def test_register_build_with_options_and_unregister() -> None:
    register("table_test")(TableReward)
    try:
        assert "table_test" in known_rewards()
        register("table_test")(TableReward)  # same object again: a no-op
        reward = build_reward("table_test", a=[7.0])
        assert reward.score(torch.zeros(1, 3, 2, 2), ["p"])["a"].tolist() == [7.0]
        with pytest.raises(ConfigError, match="does not accept the options \\['colour'\\]"):
            build_reward("table_test", colour="red")
        with pytest.raises(ValueError, match="already registered"):
            register("table_test")(lambda: TableReward())
    finally:
        unregister("table_test")
    assert "table_test" not in known_rewards()


def test_factory_that_does_not_return_a_reward_is_a_plugin_error() -> None:
    register("not_a_reward_test")(lambda: object())
    try:
        with pytest.raises(PluginError, match="not a sanarl.rewards.Reward"):
            build_reward("not_a_reward_test")
    finally:
        unregister("not_a_reward_test")


def test_lazy_entries_import_on_build_and_name_missing_packages(tmp_path, monkeypatch) -> None:
    (tmp_path / "lazy_ok_mod.py").write_text(
        "from sanarl.rewards.scorers.jpeg import JpegIncompressibility\nclass Big(JpegIncompressibility):\n    pass\n"
    )
    (tmp_path / "lazy_heavy_mod.py").write_text("import surely_not_installed_pkg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    register_lazy("lazy_ok_test", "lazy_ok_mod:Big")
    register_lazy("lazy_heavy_test", "lazy_heavy_mod:X", "pip install 'sanarl[rewards]'")
    register_lazy("lazy_missing_test", "no_such_module_here:X")
    try:
        assert "lazy_ok_mod" not in sys.modules
        assert type(build_reward("lazy_ok_test")).__name__ == "Big"
        with pytest.raises(ConfigError, match=r"'surely_not_installed_pkg'.*pip install 'sanarl\[rewards\]'"):
            build_reward("lazy_heavy_test")
        with pytest.raises(PluginError, match="does not exist"):
            build_reward("lazy_missing_test")
    finally:
        for name in ("lazy_ok_test", "lazy_heavy_test", "lazy_missing_test"):
            unregister(name)
    with pytest.raises(ValueError, match="package.module:attribute"):
        register_lazy("x", "no_colon")


# ---------------------------------------------------------------- JPEG


def _pil_jpeg_bytes(array: np.ndarray) -> int:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="JPEG", quality=95)
    return len(buffer.getvalue())


def test_jpeg_rewards_match_a_hand_computation_with_pil() -> None:
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(2, 3, 24, 40, generator=gen)
    images[1] = 0.25  # flat
    arrays = (images * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    expected_kb = [_pil_jpeg_bytes(np.ascontiguousarray(a)) / 1000 for a in arrays]
    comp = build_reward("jpeg_compressibility").score(images, ["a", "b"])
    incomp = build_reward("jpeg_incompressibility").score(images, ["a", "b"])
    assert comp["jpeg_kb"].tolist() == pytest.approx(expected_kb, rel=1e-6)
    assert comp["jpeg_compressibility"].tolist() == pytest.approx([-kb / 500 for kb in expected_kb], rel=1e-6)
    assert incomp["jpeg_incompressibility"].tolist() == pytest.approx(expected_kb, rel=1e-6)


def test_flat_image_is_more_compressible_than_noise() -> None:
    images = torch.cat([torch.full((1, 3, 64, 64), 0.5), torch.rand(1, 3, 64, 64)])
    comp = build_reward("jpeg_compressibility").score(images, ["flat", "noise"])["jpeg_compressibility"]
    incomp = build_reward("jpeg_incompressibility").score(images, ["flat", "noise"])["jpeg_incompressibility"]
    assert comp[0] > comp[1] and incomp[0] < incomp[1]
    assert incomp[1] > 5 * incomp[0]  # 64 x 64 noise is several kB, a flat image well under one
    assert jpeg_kilobytes(images[1:], quality=50)[0] < incomp[1]


# ---------------------------------------------------------------- shapes


def test_shapes_reward_scores_ground_truth_renders_perfectly() -> None:
    rows = [shapes_row("colors"), shapes_row("counting"), shapes_row("position"), shapes_row("color_attr")]
    scores = ShapesReward().score(rendered(rows), [r["prompt"] for r in rows], rows)
    assert scores["strict"].tolist() == [1.0] * 4 and scores["partial"].tolist() == [1.0] * 4
    expected_objects = [1.0, float(rows[1]["include"][0]["count"]), 2.0, 2.0]
    assert scores["objects"].tolist() == expected_objects
    assert all(0.5 < b < 1.0 for b in scores["background"].tolist())


def test_shapes_reward_partial_credit_by_hand() -> None:
    counting, position = shapes_row("counting"), shapes_row("position")
    red_circle = next(r for r in world.list_prompts("train")["colors"] if r["prompt"] == "a red circle")
    blue_circle = {
        "tag": "colors",
        "include": [{"class": "circle", "count": 1, "color": "blue"}],
        "prompt": "a blue circle",
    }
    images = torch.cat([blank(2), rendered([red_circle])])
    rows = [counting, position, blue_circle]
    scores = ShapesReward().score(images, [r["prompt"] for r in rows], rows)
    # counting on an empty image: "count >= n" fails, "exclude: fewer than n + 1" holds -> 1 / 2
    # position on an empty image: 2 count + 2 colour + 1 position clauses, none hold -> 0
    # a red circle judged as "a blue circle": the count clause holds, the colour clause does not -> 1 / 2
    assert scores["partial"].tolist() == [0.5, 0.0, 0.5]
    assert scores["strict"].tolist() == [0.0, 0.0, 0.0]
    assert scores["objects"].tolist() == [0.0, 0.0, 1.0]
    assert scores["background"][:2].tolist() == [1.0, 1.0] and scores["entropy"][:2].tolist() == [0.0, 0.0]


def test_shapes_reward_equals_the_judge_oracle() -> None:
    rows = [shapes_row("position", i) for i in range(4)]
    images = rendered(rows)
    images[1] = images[1].flip(-1)  # mirrored: left/right relations break
    images[2] = torch.rand(3, 32, 32, generator=torch.Generator().manual_seed(1))
    scores = ShapesReward(stats=False).score(images, [r["prompt"] for r in rows], rows)
    oracle = world.judge_batch(images.numpy(), rows)
    assert scores["partial"].tolist() == pytest.approx([r.partial for r in oracle])
    assert scores["strict"].tolist() == [r.strict for r in oracle]
    assert set(scores) == {"partial", "strict", "exact", "exact_partial", "objects", "extra"}
    assert scores["exact"].tolist() == [r.exact for r in oracle]
    assert scores["partial"][1] < 1.0  # the mirror really broke something


def test_shapes_reward_rejects_missing_or_foreign_metadata_naming_the_prompt() -> None:
    reward = ShapesReward()
    with pytest.raises(RewardInputError, match="'a cat on a sofa'.*sanarl.datasets.shapes"):
        reward.score(blank(2), ["a red circle", "a cat on a sofa"], [shapes_row("colors"), {}])
    foreign = {"tag": "single_object", "include": [{"class": "hexagon", "count": 1}], "prompt": "a hexagon"}
    with pytest.raises(RewardInputError, match="prompt 'a hexagon'.*hexagon"):
        reward.score(blank(1), ["a hexagon"], [foreign])
    with pytest.raises(RewardInputError, match="'a cat' has no shapes-world metadata"):
        reward.score(blank(1), ["a cat"], None)
    assert reward.score(blank(1), ["a circle"], None)["strict"].tolist() == [0.0]  # judged from its caption


# ---------------------------------------------------------------- RewardFunction


def test_reward_function_combines_by_hand() -> None:
    rows = [shapes_row("counting"), shapes_row("position"), shapes_row("colors")]
    images = torch.cat([blank(2), rendered(rows[2:])])
    cfg = reward_config(
        RewardFnConfig(name="shapes", weight=2.0),  # empty score_key -> "partial"
        RewardFnConfig(name="jpeg_incompressibility", weight=-0.5, clip_max=0.8),
        scale=3.0,
        reward_clip_min=-0.1,
    )
    fn = RewardFunction(cfg)
    result = fn(images, [r["prompt"] for r in rows], rows)
    partial = torch.tensor([0.5, 0.0, 1.0])
    kb = jpeg_kilobytes(images)
    avg = 2.0 * partial - 0.5 * kb.clamp(max=0.8)
    assert result.per_key["shapes"].tolist() == partial.tolist()
    assert result.per_key["jpeg_incompressibility"].tolist() == kb.tolist()
    assert result.per_key["avg"].tolist() == pytest.approx(avg.tolist())
    assert result.total.tolist() == pytest.approx((avg.clamp(min=-0.1) * 3.0).tolist())
    assert result.total.dtype == torch.float32 and result.nan_mask.tolist() == [False] * 3
    assert result.per_key["shapes/strict"].tolist() == [0.0, 0.0, 1.0]
    assert result.per_key["jpeg_incompressibility/jpeg_kb"].tolist() == kb.tolist()
    assert set(result.durations) == {"shapes", "jpeg_incompressibility"}


def test_score_key_selects_another_output_and_bad_keys_name_the_choices() -> None:
    rows = [shapes_row("counting")]
    fn = RewardFunction(reward_config(RewardFnConfig(name="shapes", score_key="strict")))
    assert fn(blank(1), [rows[0]["prompt"]], rows).total.tolist() == [0.0]
    with pytest.raises(ConfigError) as err:
        RewardFunction(reward_config(RewardFnConfig(name="shapes", score_key="acc")))
    msg = str(err.value)
    assert "reward_fns[0]" in msg and "'acc'" in msg and "'partial', 'strict'" in msg


def test_reward_function_config_errors() -> None:
    with pytest.raises(ConfigError, match="Known rewards"):
        RewardFunction(reward_config(RewardFnConfig(name="pikscore")))
    with pytest.raises(ConfigError, match="no rewards configured"):
        RewardFunction(reward_config())
    twice = reward_config(RewardFnConfig(name="shapes"), RewardFnConfig(name="shapes", score_key="strict"))
    with pytest.raises(ConfigError, match="more than once"):
        RewardFunction(twice)
    with pytest.raises(ConfigError, match=r"options given for \['jpeg'\]"):
        RewardFunction(reward_config(RewardFnConfig(name="shapes")), options={"jpeg": {}})


def test_reward_function_options_and_from_config() -> None:
    cfg = Config()
    cfg.train.train_policy.remote_reward.reward_fns = [RewardFnConfig(name="shapes")]
    fn = RewardFunction.from_config(cfg, options={"shapes": {"stats": False}})
    row = shapes_row("colors")
    result = fn(rendered([row]), [row["prompt"]], [row])
    assert result.total.tolist() == [1.0]
    assert "shapes/background" not in result.per_key


def test_nan_samples_are_masked_and_counted(caplog) -> None:
    fake = TableReward(a=[0.5, float("nan"), 2.0, float("inf")])
    cfg = reward_config(RewardFnConfig(name="t", weight=2.0))
    result = RewardFunction(cfg, rewards={"t": fake})(torch.zeros(4, 3, 2, 2), list("pqrs"))
    assert result.nan_mask.tolist() == [False, True, False, True] and result.num_dropped == 2
    assert result.total[~result.nan_mask].tolist() == [1.0, 4.0]
    assert "dropping 2 of 4 samples" in caplog.text
    clipped = reward_config(RewardFnConfig(name="t", weight=2.0, clip_max=1.0))
    result = RewardFunction(clipped, rewards={"t": fake})(torch.zeros(4, 3, 2, 2), list("pqrs"))
    assert result.nan_mask.tolist() == [False, True, False, False]  # inf clipped to 1 is a valid reward
    assert result.total[3].item() == 2.0


def test_all_nan_batch_raises_reward_failure() -> None:
    fake = TableReward(a=[float("nan")] * 3)
    fn = RewardFunction(reward_config(RewardFnConfig(name="t")), rewards={"t": fake})
    with pytest.raises(RewardFailure, match="every one of the 3 samples.*t: 3"):
        fn(torch.zeros(3, 3, 2, 2), list("abc"))
    assert issubclass(RewardFailure, RuntimeError)


def test_exception_inside_a_reward_names_it() -> None:
    fns = reward_config(RewardFnConfig(name="shapes"), RewardFnConfig(name="broken"))
    fn = RewardFunction(fns, rewards={"broken": TableReward(error="model exploded")})
    row = shapes_row("colors")
    with pytest.raises(RewardFailure, match="reward 'broken' failed.*ValueError: model exploded") as err:
        fn(rendered([row]), [row["prompt"]], [row])
    assert isinstance(err.value.__cause__, ValueError)
    with pytest.raises(RewardInputError, match="reward 'shapes': prompt 'a cat'.*not in the shapes grammar"):
        fn(blank(1), ["a cat"], [{}])  # bad input stays a user error (exit code 2)


def test_result_metrics_by_hand() -> None:
    fake = TableReward(a=[1.0, 3.0, float("nan"), 2.0], b=[4.0, 4.0, 4.0, float("nan")])
    fn = RewardFunction(reward_config(RewardFnConfig(name="t")), rewards={"t": fake})
    metrics = fn(torch.zeros(4, 3, 2, 2), list("abcd")).metrics()
    # kept samples 0, 1, 3: totals 1, 3, 2 -> mean 2, population std sqrt(2/3)
    assert metrics["reward/mean"] == pytest.approx(2.0)
    assert metrics["reward/std"] == pytest.approx((2 / 3) ** 0.5)
    assert (metrics["reward/min"], metrics["reward/max"], metrics["reward/dropped"]) == (1.0, 3.0, 1.0)
    assert metrics["reward/t/b"] == pytest.approx(4.0)  # NaN of a non-selected key is ignored
    assert metrics["reward/avg"] == pytest.approx(2.0)
    assert metrics["reward/time/t"] >= 0.0
