"""The fault-injection suite (issue 26): a hostile container, a run deleted or replaced under a watch, signals at
each step of export and deploy, bad numbers. Each test failed on the tree before the fix it keeps true."""

from __future__ import annotations

from lifecycle.conftest import CliResult, cli  # noqa: F401 - the in-process CLI fixture, shared
