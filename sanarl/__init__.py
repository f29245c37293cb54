"""sanarl: post-training for text-to-image and text-to-video diffusion models."""

__version__ = "0.1.0"

# The method registry hands the config loader its table of methods and their checks (sanarl/config/methods.py);
# importing it here makes that table complete for every `import sanarl...`. It imports no torch.
from sanarl.methods import registry as _registry  # noqa: E402, F401
