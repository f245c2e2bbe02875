"""paramiko, imported without `invoke`: the one place the ssh modules get paramiko from.

paramiko.config imports `invoke` (a task runner: ~0.1 s, a third of the cost of importing paramiko, paid by every
ssh command) only to run `Match exec` lines of an ssh_config. This module imports paramiko with `invoke` blocked;
`sshconfig.load_ssh_config` brings invoke in when a config really has a `Match … exec`. A leaf: it imports nothing
from dflashctl, so ssh.py, sshconfig.py and proxycommand.py all depend on it and never on each other for paramiko.
"""

from __future__ import annotations

import sys


def _import_paramiko():  # noqa: ANN202 - returns the module
    if "invoke" in sys.modules:
        import paramiko

        return paramiko
    sys.modules["invoke"] = None  # type: ignore[assignment]  # `import invoke` raises ImportError meanwhile
    try:
        import paramiko
    finally:
        if sys.modules.get("invoke", 0) is None:
            del sys.modules["invoke"]
    return paramiko


paramiko = _import_paramiko()
