"""The library every container program is built from (stdlib only; in the agent archive with them)."""
