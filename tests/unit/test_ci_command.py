"""The README's test command is the one CI runs: its fenced block under "Install what the tests need" equals a
command line of .ci/run, and the install it starts provides what the suite imports at collection (the reward
service's redis client, the redis-server binary, the no-deps image-reward)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def readme_test_command() -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"^Install what the tests need.*?\n```\n(.*?)\n```", text, re.M | re.S)
    assert match, "README.md: no fenced block after 'Install what the tests need'"
    lines = [line.strip() for line in match.group(1).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def script_commands(path: Path) -> list[str]:
    """The command lines of a bash script: comments, blank lines and `set` / `cd` / `export` setup dropped."""
    commands = []
    for raw in path.read_text().splitlines():
        line = re.sub(r"\s+#\s.*$", "", raw).strip()
        if line and not line.startswith("#") and line.split()[0] not in {"set", "cd", "export"}:
            commands.append(line)
    return commands


def test_ci_runs_the_readme_test_command():
    command = readme_test_command()
    assert command in script_commands(ROOT / ".ci" / "run")
    scripts = [w for w in shlex.split(command) if w.startswith("scripts/")]
    assert scripts == ["scripts/install_test_deps.sh", "scripts/test.sh"]
    assert all((ROOT / s).is_file() for s in scripts)


def test_the_install_provides_what_the_suite_needs():
    install = " ".join(script_commands(ROOT / "scripts" / "install_test_deps.sh"))
    extras = re.search(r'-e "\.\[([\w,]+)\]"', install)
    assert extras, install
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    wanted = {re.split(r"[<>=\[; ]", r)[0] for name in extras.group(1).split(",") for r in optional[name]}
    assert {"pytest", "redis", "fastapi", "open_clip_torch", "rapidocr-onnxruntime", "av"} <= wanted, wanted
    assert "apt-get install -y -qq redis-server" in install
    assert "bash scripts/install_imagereward.sh" in install  # the imagereward reward's documented step
    imagereward = " ".join(script_commands(ROOT / "scripts" / "install_imagereward.sh"))
    assert "--no-deps image-reward==1.5" in imagereward and "fairscale==0.4.13" in imagereward
    assert "imagereward" not in optional  # no extra that pip cannot install (image-reward's own pins)
