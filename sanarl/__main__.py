"""`python -m sanarl ...` (and `accelerate launch -m sanarl ...`)."""

from sanarl.cli import main

main()
