"""AWM, Advantage Weighted Matching (docs/awm.md)."""
