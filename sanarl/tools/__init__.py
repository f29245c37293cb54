"""Operational tools run as modules (`python -m sanarl.tools.gpu_check`)."""
