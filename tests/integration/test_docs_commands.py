"""Every command in README.md and docs/*.md is run, or listed below with the reason it cannot run here, so the docs
cannot drift from the code. Commands are read from the fenced blocks (continuation lines joined, `&&` chains
split, `# comments` and the aligned descriptions of synopsis blocks dropped) and from inline `sanarl --config
PRESET PLUGIN` spans (the preset tables), so a new doc is covered on its own;
a command that fits no rule and no entry of NOT_RUN fails `test_every_documented_command_has_a_plan`.

How each kind runs (in a scratch folder that links the checkout's files, as a user at the repo root would):
- `sanarl validate ...`, `sanarl presets`, `sanarl --help`: as written.
- training runs (`sanarl [train] --config PRESET PLUGIN ...`): at validate level (the same preset, plugin and
  --set values; full runs take minutes to days), except the worked plugin example of docs/plugins.md, which
  trains, capped at 2 steps (`--set train.max_num_steps=2`).
- `sanarl eval ...`: as written on 4 samples of 2 steps; a `--checkpoint outputs/<tiny preset>` it reads is made
  first by 1 step of that preset on the shapes plugin.
- `accelerate launch ... -m sanarl ARGS`: its --config_file exists and ARGS validate for --num_processes ranks.
- `sanarl-reward --config X`: X loads and its rewards build (the live service: tests/service/).
- synopsis lines (placeholders such as PRESET, `...`, `[--flag]`): their command's `--help` works.
- `printf ... > file` and `python benchmarks/...`: run as written (later commands read the file; the
  benchmarks documented in docs/ take seconds on the tiny models).
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console"}
PROGRAMS = {"sanarl", "sanarl-reward", "python", "pip", "bash", "accelerate", "hf", "printf", "export", "apt-get",
            "curl", "mkdir", "cp"}  # fmt: skip
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]{1,}\b|\.\.\.|\[|\||<")
EXAMPLE_PLUGIN = "examples/plugins/my_prompts.py"

NOT_RUN: list[tuple[str, str]] = [
    (r"^pip |^apt-get ", "installs packages: CI's own install (.ci/run) and scripts/check_wheel.sh do this"),
    (
        r"^bash scripts/(test|install_test_deps|install_imagereward)\.sh|^python -m pytest",
        "the test suite and its install (CI runs them: tests/unit/test_ci_command.py)",
    ),
    (r"^hf download|^python -c \"import torch, torchvision", "downloads weights (no network in tests)"),
    (r"^mkdir -p reward_ckpts|^cp ", "places downloaded reward weights (docs/rewards.md)"),
    (
        r"^python -m sanarl\.tools\.gpu_check",
        "needs a CUDA GPU (tests/gpu/, tests/integration/test_gpu_check.py)",
    ),
    (
        r"^export |^curl |^UUID=|^python - <<",
        "the live reward-service walkthrough (tests/service/ drives it)",
    ),
    (
        r"--set train\.train_policy\.use_remote_reward=true$",
        "needs the reward service and REMOTE_REWARD_* of the walkthrough: tests/service/test_trainer_remote.py "
        "validates this command against a live service (and trains the same way)",
    ),
    (r"--checkpoint outputs/sana-nft", "needs a trained SANA 1.5 run and GenEval / PickScore weights (GPU)"),
    (
        r"--checkpoint outputs/nft-guard/",
        "reads the two 15-minute runs docs/results.md records (their commands above it are validated)",
    ),
    (r"--config my-soar\.toml", "the reader's own preset and bucketed JSONL data"),
    (
        r"^python -m sanarl\.tools\.capacity_table",
        "regenerates docs/capacity.md (tests/unit/test_capacity_table.py regenerates its rows and compares)",
    ),
    (
        r"^python scripts/(measure_capacity|random_pipeline)\.py",
        "real-size runs of tens of minutes on 9 GB of random weights; tests/integration/test_measure_capacity.py "
        "runs the same script on the tiny preset",
    ),
    (
        r"^sanarl bench shapes --(output|methods soar,sft-more|methods ddrl,grpo,nft,sft-more|methods awm,dpo,dpo-online,mixgrpo,grpo-guard,nft,grpo,sft-more"
        r"|methods (nft|nft-solrl|grpo) --seeds 1 --budget-minutes 30) ",
        "the measured benches of docs/results.md (half an hour to two hours of CPU each); the same code runs shortened in "
        "tests/integration/test_bench_shapes.py",
    ),
    (r"--checkpoint outputs/bench-default/", "reads the 30-minute bench runs of the command above it"),
    (
        r"local_dir=/path/to/",
        "the reader's own data (docs/cosmos-rl.md's validate block runs the same preset on the shipped examples)",
    ),
    (
        r"local_dir=/data/",
        "the reader's own data under /data/ (the preset validates in tests/integration/test_cli.py)",
    ),
]


@dataclass(frozen=True)
class DocCommand:
    where: str
    text: str


def _lines(block: str) -> list[str]:
    joined = re.sub(r"\s*\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        line = re.sub(r"\s+#\s.*$", "", line.strip())  # a trailing comment
        line = re.split(r"\s{3,}", line)[0]  # the aligned description of a synopsis line
        out.extend(part.strip() for part in line.split(" && "))
    return [line for line in out if line]


def _is_command(line: str) -> bool:
    first = line.split()[0]
    return first in PROGRAMS or re.match(r"^[A-Z_]+=\$\(", first) is not None


FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.M | re.S)
INLINE_RUN = re.compile(r"`(sanarl (?:validate )?--config [\w.\-/]+ [\w.\-/]+(?: --set [^`\s]+)*)`")
"""Inline training / validate commands (tables of presets in the docs); prose mentions such as `sanarl eval` are
names, not commands."""


def extract(path: Path) -> list[DocCommand]:
    """The commands of the fenced shell blocks of a markdown file, then its inline training commands."""
    text = path.read_text()
    commands = []
    for match in FENCE.finditer(text):
        if match.group(1).strip() not in SHELL_BLOCKS:
            continue
        line_no = text[: match.start()].count("\n") + 2
        for line in _lines(match.group(2)):
            if _is_command(line):
                commands.append(DocCommand(f"{path.relative_to(ROOT)}:{line_no}", line))
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for match in INLINE_RUN.finditer(prose):
        line_no = prose[: match.start()].count("\n") + 1
        commands.append(DocCommand(f"{path.relative_to(ROOT)}:{line_no}", match.group(1)))
    return commands


COMMANDS = [command for doc in DOCS for command in extract(doc)]


def not_run_reason(text: str) -> str | None:
    return next((reason for pattern, reason in NOT_RUN if re.search(pattern, text)), None)


def plan(text: str) -> str:
    """The kind of run a documented command gets (see the module docstring); "" when none fits."""
    if not_run_reason(text):
        return "not-run"
    words = text.split()
    if words[0] == "printf":
        return "shell"
    if words[0] == "accelerate" and "-m" in words:
        return "accelerate"
    if words[0] == "sanarl-reward":
        return "service"
    if words[0] == "python" and len(words) > 1 and words[1].startswith("benchmarks/"):
        return "shell"
    if words[0] == "python" and words[1:3] == ["-m", "sanarl"]:
        words = words[2:]
    if words[0] != "sanarl":
        return ""
    if PLACEHOLDER.search(text):
        return "synopsis"
    sub = words[1] if len(words) > 1 else ""
    if sub in {"validate", "presets", "--help"}:
        return "as-written"
    if sub == "eval":
        return "eval"
    if EXAMPLE_PLUGIN in words:
        return "two-steps"
    return "validate" if sub in {"--config", "train", "-c"} else ""


def test_every_documented_command_has_a_plan():
    assert len(COMMANDS) > 30
    unplanned = [f"{c.where}: {c.text}" for c in COMMANDS if not plan(c.text)]
    assert unplanned == [], "add a rule to plan() or an entry with its reason to NOT_RUN"


def test_every_not_run_entry_still_names_a_documented_command():
    for pattern, reason in NOT_RUN:
        assert any(re.search(pattern, c.text) for c in COMMANDS), (pattern, reason)


def test_every_documented_accelerate_config_file_exists():
    files = [
        w[i + 1]
        for w in (shlex.split(c.text) for c in COMMANDS)
        for i, a in enumerate(w)
        if a == "--config_file"
    ]
    assert len(files) >= 4 and all((ROOT / f).is_file() for f in files), files


def test_the_worked_plugin_example_and_the_readme_commands_are_covered():
    kinds = {c.text: plan(c.text) for c in COMMANDS}
    assert "two-steps" in kinds.values() and "eval" in kinds.values()
    assert kinds["sanarl --config tiny-shapes-sft sanarl.datasets.shapes"] == "validate"


# --- running them ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A scratch folder that looks like the repository root (its top-level entries linked), with `configs/`
    standing for a Cosmos-RL checkout's (docs/cosmos-rl.md): the stored copies of its diffusion presets."""
    folder = tmp_path_factory.mktemp("docs-cwd")
    for entry in ROOT.iterdir():
        if entry.name not in {".git", "outputs", "build"}:
            (folder / entry.name).symlink_to(entry)
    (folder / "configs").symlink_to(ROOT / "tests" / "data" / "cosmos_rl")
    return folder


@pytest.fixture
def sanarl_cli(capsys, monkeypatch, workdir):
    from sanarl.cli import main

    monkeypatch.chdir(workdir)

    def run(args: list[str]) -> tuple[int, str]:
        try:
            main(args)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    return run


def _sanarl_args(text: str) -> list[str]:
    words = shlex.split(text)
    start = words.index("sanarl") + 1 if "sanarl" in words else 3  # "python -m sanarl ..."
    args = words[start:]
    return args[1:] if args[:1] == ["train"] else args


def _validate_args(args: list[str]) -> list[str]:
    return ["validate", *[a for a in args if a not in {"--dry-run"}]]


def _ensure_checkpoint(args: list[str], workdir: Path, sanarl_cli) -> None:
    """The run an eval command reads (`--checkpoint outputs/<tiny preset>`): 1 step of that preset."""
    if "--checkpoint" not in args:
        return
    run = args[args.index("--checkpoint") + 1]
    preset = Path(run).name
    if (workdir / run / "checkpoints").is_dir() or not preset.startswith("tiny-"):
        return
    small = ["train.max_num_steps=1", "train.train_batch_per_replica=16", "train.train_policy.mini_batch=16",
             f"train.output_dir={run}", "validation.enable=false"]  # fmt: skip
    code, output = sanarl_cli(
        ["--config", preset, "sanarl.datasets.shapes", *[a for s in small for a in ("--set", s)]]
    )
    assert code == 0, output


def _synopsis_help(text: str) -> list[str]:
    args = _sanarl_args(text)
    sub = [a for a in args[:2] if not a.startswith("-") and a.isidentifier()]
    if not sub or sub[0] not in {"validate", "presets", "eval", "bench"}:
        return ["train", "--help"]
    return [*sub[: 2 if sub[0] == "bench" else 1], "--help"]


def _accelerate(text: str, sanarl_cli) -> None:
    words = shlex.split(text)
    if "--config_file" in words:
        assert (ROOT / words[words.index("--config_file") + 1]).is_file(), text
    ranks = words[words.index("--num_processes") + 1] if "--num_processes" in words else "8"
    args = _sanarl_args(" ".join(words[words.index("-m") + 1 :]))
    if PLACEHOLDER.search(" ".join(args)):
        return
    code, output = sanarl_cli([*_validate_args(args), "--world-size", ranks])
    assert code == 0, output


def _service(text: str) -> None:
    from reward_service.config import load_service_config
    from reward_service.rewards_setup import build_rewards

    words = shlex.split(text)
    build_rewards(load_service_config(words[words.index("--config") + 1]), load=False)


@pytest.mark.parametrize("command", COMMANDS, ids=[f"{c.where} {c.text[:60]}" for c in COMMANDS])
def test_documented_command_runs(command, sanarl_cli, workdir, monkeypatch):
    kind, text = plan(command.text), command.text
    if kind == "not-run":
        return  # its reason is in NOT_RUN; test_every_not_run_entry_still_names_a_documented_command keeps it true
    if kind == "shell":
        subprocess.run(["bash", "-c", text], cwd=workdir, check=True)
        return
    if kind == "accelerate":
        return _accelerate(text, sanarl_cli)
    if kind == "service":
        monkeypatch.chdir(workdir)
        return _service(text)
    args = _sanarl_args(text)
    if kind == "synopsis":
        args = _synopsis_help(text)
    elif kind == "validate":
        args = _validate_args(args)
    elif kind == "two-steps":
        args = [*args, "--set", "train.max_num_steps=2", "--set", "train.output_dir=outputs/worked-example"]
    elif kind == "eval":
        _ensure_checkpoint(args, workdir, sanarl_cli)
        args = [*args, "--num", "4", "--steps", "2", "--batch-size", "4"]
    code, output = sanarl_cli(args)
    assert code == 0, f"{command.where}: sanarl {' '.join(args)}\n{output[-3000:]}"
