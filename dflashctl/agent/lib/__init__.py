"""The library every container program is built from (stdlib only; bundled into each as it travels)."""
