"""The Cosmos-RL compatibility layer of the config (docs/cosmos-rl.md): Cosmos-RL's key tables as data
(`key_table.py`, `wfm_key_table.py` for its world-model `[model.rl]` keys), the lookups over them, its dataset
launchers, reward names and defaults (`drop_in.py`), and the build hooks that plug them into the strict loader
(`schema_hooks.py`)."""
