"""Benchmarks run from the CLI: `sanarl bench shapes` (shapes.py; methods.py, report.py, base_model.py)."""
