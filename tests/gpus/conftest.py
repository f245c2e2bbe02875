"""The shared GPU-host scene (scene.py) as a fixture."""

from __future__ import annotations

import pytest

from .scene import build


@pytest.fixture
def scene(pve, tmp_path):
    if pve.container_cgroup is None:
        pytest.skip("no writable cgroup v2 hierarchy here: host pid -> container mapping cannot be emulated")
    s = build(pve, tmp_path)
    yield s
    s.close()
