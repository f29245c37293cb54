"""Procedural worlds: prompts, deterministic renderers and programmatic judges (numpy only), shared by the dataset
plugins (sanarl/datasets/) and the rewards (sanarl/rewards/).

- `shapes`: the captioned-shapes image world (docs/shapes.md).
- `moving_shapes`: clips of one shape moving left / right / up / down (docs/video.md).
- `geneval_templates`: GenEval-style prompt templates over the COCO classes.
"""
