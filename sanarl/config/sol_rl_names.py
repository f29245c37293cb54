"""Sol-RL's config names on `--config` (docs/nft.md, "Sol-RL presets").

Sol-RL (NVlabs/Sana `configs/sol_rl`) names its configs `<model>_<mode>_<reward>`. Two layouts of that folder exist:
the older one has 48 names (models `sana`, `flux1`, `sd3` x modes `diffusionnft`, `naive_scaling`, `naive_quant`,
`sol_rl` x 4 rewards), its `naive_scaling` sampling the drafts from the bf16 torch.compile'd copy; the later one
gives `flux1` and `sd3` a fifth mode `compile` (that copy) and makes their `naive_scaling` sample from the eager
PEFT model, while `sana` keeps the older four modes (56 names). sanarl ships one preset per rollout, so a name
resolves to a preset plus the reward; a name whose rollout differs between the layouts is refused with both
choices.
"""

from __future__ import annotations

from dataclasses import dataclass

from sanarl.errors import ConfigError

MODELS = {"sana": "sana-image", "flux1": "flux1", "sd3": "sd35l"}
"""Sol-RL's model part -> the prefix of sanarl's presets."""
REWARDS = ("pickscore", "clipscore", "hpsv2", "imagereward")
"""Sol-RL's reward part; each is a sanarl reward of the same name (the presets ship with pickscore)."""
SHIPPED_REWARD = "pickscore"
REWARD_KEY = "train.train_policy.remote_reward.reward_fns.0.name"

_OLDER_MODES = {
    "diffusionnft": "",
    "naive_scaling": "compile",
    "naive_quant": "naive_quant",
    "sol_rl": "sol_rl",
}
_LATER_MODES = {**_OLDER_MODES, "naive_scaling": "naive_scaling", "compile": "compile"}
LAYOUTS: dict[str, dict[str, dict[str, str]]] = {
    "older": {model: _OLDER_MODES for model in MODELS},
    "later": {"sana": _OLDER_MODES, "flux1": _LATER_MODES, "sd3": _LATER_MODES},
}
"""layout -> model -> mode -> the preset's rollout family ("" = the model's DiffusionNFT baseline)."""
LAYOUT_NAMES = {"older": "the older layout (48 names)", "later": "the later layout (56 names)"}


def preset_of(model: str, family: str) -> str:
    """The shipped preset of a model's rollout family (SANA's 24-in-24 baseline is `sana-image-nft-diffusionnft`;
    `sana-image-nft` is Cosmos-RL's recipe)."""
    prefix = MODELS[model]
    if not family:
        return f"{prefix}-nft-diffusionnft" if model == "sana" else f"{prefix}-nft"
    return f"{prefix}-nft-{family}"


def layout_names(layout: str) -> list[str]:
    """Every config name of one layout."""
    return [
        f"{model}_{mode}_{reward}"
        for model, modes in LAYOUTS[layout].items()
        for mode in modes
        for reward in REWARDS
    ]


@dataclass(frozen=True)
class SolRLName:
    """A Sol-RL config name resolved: the shipped preset and the reward it trains on."""

    name: str
    preset: str
    reward: str

    def overrides(self) -> list[str]:
        """The `--set` values that make the preset this config (none for the shipped reward)."""
        return [] if self.reward == SHIPPED_REWARD else [f"{REWARD_KEY}={self.reward}"]

    def note(self) -> str:
        sets = "".join(f" --set {o}" for o in self.overrides())
        return (
            f"`--config {self.name}` is Sol-RL's config name: it runs the shipped preset `{self.preset}` with the "
            f'{self.reward} reward (`--config {self.preset}{sets}`; docs/nft.md, "Sol-RL presets").'
        )


def _parse(name: str) -> tuple[str, str, str] | None:
    model, _, rest = name.partition("_")
    mode, _, reward = rest.rpartition("_")
    return (model, mode, reward) if model in MODELS and reward in REWARDS and mode else None


def resolve_sol_rl_name(name: str) -> SolRLName | None:
    """The preset behind Sol-RL's config `name`, None when it does not read `<model>_<mode>_<reward>`. Raises
    ConfigError when the two layouts give the name different rollouts (the choice is the user's) or no layout has
    its mode."""
    parsed = _parse(name)
    if parsed is None:
        return None
    model, mode, reward = parsed
    found = {
        layout: preset_of(model, modes[model][mode])
        for layout, modes in LAYOUTS.items()
        if mode in modes[model]
    }
    presets = sorted(set(found.values()))
    if not presets:
        modes = sorted({m for layout in LAYOUTS.values() for m in layout[model]})
        raise ConfigError(
            f"`--config {name}` reads as a Sol-RL config name, but no configs/sol_rl layout has the mode `{mode}` "
            f"for `{model}`: its modes are {', '.join(modes)} (`{model}_<mode>_{reward}`), and a shipped preset "
            f'path or name works too (`sanarl presets` lists them; docs/nft.md, "Sol-RL presets").'
        )
    if len(presets) > 1:
        sets = "".join(f" --set {o}" for o in SolRLName(name, "", reward).overrides())
        choices = ". ".join(
            f"In {LAYOUT_NAMES[layout]} it is `--config {preset}{sets}`" for layout, preset in found.items()
        )
        raise ConfigError(
            f"`--config {name}` is ambiguous: Sol-RL's `{mode}` meant the compiled bf16 copy in the older "
            f"configs/sol_rl layout and the eager PEFT model in the later one. {choices}. Pass the preset of the "
            'rollout you mean (docs/nft.md, "Sol-RL presets").'
        )
    return SolRLName(name, presets[0], reward)
