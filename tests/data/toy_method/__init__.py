"""A toy post-training method, one folder as docs/architecture.md ("Adding a method") says: its config view, checks
and cost arithmetic (config.py) and its task (task.py). tests/integration/test_toy_method.py adds its one registry
entry and runs it through the CLI."""
