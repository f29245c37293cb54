"""Import a reference's modules from a temporary copy of the user's checkout (its code never enters the repository).

flow_grpo and DiffusionNFT both ship a top-level package named `flow_grpo`: each import first drops any
`flow_grpo*` module already loaded, so the two pairs run one after the other in one process. Where the copied
modules call CUDA unconditionally (`.cuda()`, `torch.device("cuda")`, `device="cuda"`) and no GPU is present, the
copy is patched to the CPU and each patched line is reported.
"""

from __future__ import annotations

import importlib
import re
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import torch

CUDA_ONLY = (
    (re.compile(r"\.cuda\(\)"), ".cpu()"),
    (re.compile(r"torch\.device\((['\"])cuda\1\)"), 'torch.device("cpu")'),
    (re.compile(r"device=(['\"])cuda\1"), 'device="cpu"'),
)
"""CUDA-only device choices and their CPU replacement (applied only without a GPU)."""


def _patch_cuda(root: Path, files: list[Path]) -> list[str]:
    """Rewrite the CUDA-only device choices of `files` (inside the temporary copy); one note per patched line."""
    notes = []
    for path in files:
        lines = path.read_text().splitlines(keepends=True)
        changed = False
        for i, line in enumerate(lines):
            new = line
            for pattern, repl in CUDA_ONLY:
                new = pattern.sub(repl, new)
            if new != line:
                notes.append(f"{path.relative_to(root)}:{i + 1}: {line.strip()} -> {new.strip()}")
                lines[i], changed = new, True
        if changed:
            path.write_text("".join(lines))
    return notes


def import_reference(
    checkout: Path, package: str, modules: list[str], scratch: Path
) -> tuple[dict[str, ModuleType], list[str]]:
    """Copy `checkout/package` under `scratch`, patch CUDA-only calls in the `modules` files when there is no GPU,
    import `modules` (dotted names under `package`) from the copy. Returns the modules and the patch notes."""
    source = checkout / package
    if not source.is_dir():
        print(
            f"{checkout} has no {package}/ package: pass the root of that repository's checkout.",
            file=sys.stderr,
        )
        raise SystemExit(2)
    root = Path(tempfile.mkdtemp(prefix=f"{checkout.name}-", dir=scratch))
    shutil.copytree(source, root / package, ignore=shutil.ignore_patterns("__pycache__", "assets", "*.png"))
    files = [root / package / (name.replace(".", "/") + ".py") for name in modules]
    notes = [] if torch.cuda.is_available() else _patch_cuda(root, [f for f in files if f.exists()])
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        loaded = {name: importlib.import_module(f"{package}.{name}") for name in modules}
    finally:
        sys.path.remove(str(root))
    return loaded, notes
