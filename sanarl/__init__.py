"""sanarl: post-training for text-to-image and text-to-video diffusion models."""

__version__ = "0.1.0"
