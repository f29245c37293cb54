"""Fixture: a dataset plugin whose import raises (test_plugins: "raised while importing")."""

from __future__ import annotations

BROKEN_SETTING = {"size": 4}
raise RuntimeError("boom: plugin setup failed for " + str(BROKEN_SETTING["size"]))
