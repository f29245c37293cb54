"""sanarl."""
