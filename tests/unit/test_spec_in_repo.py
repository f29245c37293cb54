"""The math spec lives in the repository: docs/algorithms.md exists with the sections code and docs cite, and no
file points at a spec a user of sanarl cannot see."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE_SPEC = "ALGORITHMS" + ".md"  # spelled in two parts so this file does not match itself


def _repo_files() -> list[Path]:
    """Every file of the checkout outside .git: tracked and untracked-but-not-ignored (git), else a walk."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return [ROOT / line for line in out.splitlines() if (ROOT / line).is_file()]
    except (OSError, subprocess.CalledProcessError):
        return [p for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]


def test_no_file_mentions_the_outside_spec():
    hits = []
    for path in _repo_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if OUTSIDE_SPEC in text:
            hits.append(str(path.relative_to(ROOT)))
    assert not hits, f"cite docs/algorithms.md (section title) instead of {OUTSIDE_SPEC} in: {hits}"


def test_every_cited_section_of_docs_algorithms_exists():
    titles = {
        m.group(1).strip()
        for m in re.finditer(r"^#{2,3} (.+)$", (ROOT / "docs" / "algorithms.md").read_text(), re.M)
    }
    cited = set()
    for path in [*ROOT.glob("sanarl/**/*.py"), *ROOT.glob("docs/*.md"), *ROOT.glob("tests/**/*.py")]:
        if path.name == Path(__file__).name:
            continue
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r'docs/algorithms\.md[,:]?\s*\(?"([^"]{1,60})"', text):
            cited.add(" ".join(m.group(1).split()))
    assert cited, "nothing cites docs/algorithms.md"
    missing = sorted(c for c in cited if c not in titles)
    assert not missing, f"cited sections missing from docs/algorithms.md: {missing}"


def test_docs_label_work_by_date_and_commit_not_by_work_period():
    """README.md and docs/ speak of the project only: a measured number is labelled by its date and commit."""
    period = re.compile(r"\bsessions?\b|\bround \d", re.IGNORECASE)
    hits = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if period.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:80]}")
    assert not hits, "label results by date and commit (e.g. '2026-12-01, commit 6d9e316'):\n" + "\n".join(
        hits
    )
