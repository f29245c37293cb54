"""The sanarl reward service: FastAPI + Redis + reward worker processes (`sanarl-reward`, docs/reward-service.md).

Modules: config (rewards.toml), protocol (the wire format), app (HTTP), broker (server-side Redis), lua (atomic
task transitions), keys (Redis layout), worker / scoring (the worker processes), supervisor / embedded_redis
(child processes), rewards_setup (building rewards), benchmark (remote vs in-process scoring).
"""
