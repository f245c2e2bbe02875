"""A Target is where commands really run: the host's shell, or `pct exec CTID --` inside it.

`pct exec` hands argv to lxc-attach with no shell, forwards stdin and returns the command's exit
status, so wrapping is just a prefix. The container is known to run once a command has succeeded in it;
`pct status CTID` is asked only to explain a failure (or before a stream, which has no exit status up front).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from dflashctl.errors import ContainerNotRunning, NotFound
from dflashctl.model import Host
from dflashctl.remote.transport import Result, Transport


class Target:
    def __init__(self, host: Host, transport: Transport):
        self.host = host
        self.transport = transport
        self._checked = host.container is None

    def wrap(self, argv: Sequence[str]) -> list[str]:
        if self.host.container is None:
            return list(argv)
        return ["pct", "exec", str(self.host.container), "--", *argv]

    def ensure_running(self) -> None:
        if self._checked:
            return
        ct = str(self.host.container)
        res = self.transport.run(["pct", "status", ct], timeout=30)
        text = res.out.strip()
        if not res.ok:
            raise NotFound(
                f"host {self.host.name}: container {ct} not found ({res.tail() or f'pct exit {res.exit_code}'})",
                hint="check `container` in hosts.toml against `pct list` on the Proxmox host",
            )
        if text != "status: running":
            raise ContainerNotRunning(
                f"host {self.host.name}: container {ct} is not running ({text or 'no status'})",
                hint=f"start it on the Proxmox host with `pct start {ct}`",
            )
        self._checked = True

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> Result:
        """No `pct status` round trip first: `pct exec` itself refuses a stopped or unknown container
        (running nothing), so the first command is sent at once; only when it fails is `pct status` asked
        which failure it was, to raise the precise one-line error (else the command's own failure stands)."""
        res = self.transport.run(self.wrap(argv), stdin=stdin, timeout=timeout)
        if not self._checked:
            if not res.ok:
                self.ensure_running()
            self._checked = True  # it ran (exit 0), or pct status says the container is running
        return res

    def stream(self, argv: Sequence[str], *, stdin: bytes | None = None) -> Iterator[bytes]:
        self.ensure_running()
        return self.transport.stream(self.wrap(argv), stdin=stdin)

    def run_host(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> Result:
        """Run on the Proxmox host itself, outside the container (host-side nvidia-smi)."""
        return self.transport.run(argv, stdin=stdin, timeout=timeout)

    def python(
        self, script: str, *args: str, timeout: float | None = None
    ) -> Result:
        """Run a stdlib Python script sent on stdin: no quoting of the script, ever."""
        return self.run([self.host.python, "-", *args], stdin=script.encode(), timeout=timeout)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
