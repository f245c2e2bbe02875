"""`status --all` over 1, 4 and 16 simulated Proxmox hosts: does the fan-out scale?

    .venv/bin/python benchmarks/fanout.py [--hosts 1,4,16] [--calls 5] [--delay-ms 25] [--out FILE]

Needs root and OpenSSH's sshd (the test harness: one real sshd on 127.0.0.1, one `pct` stand-in container per host
with a live run printing progress, the nvidia-smi stand-in). Every host entry reaches that sshd through a latency
relay in this process that delays each chunk by --delay-ms one way (so a round trip costs 2 × delay, pipelined,
as on a real network); each host is its own container. `dflashctl status --all --json` runs as a new process each
call, with `persist = 0` (a fresh ssh connection per host and call) and with warm connection masters.
One machine plays every host here: their probes share its CPUs, which real hosts do not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from harness.envs import PveEnv, toml_str  # noqa: E402
from harness.sshd import SshdServer  # noqa: E402
from loopback import publish, result_path, sshd_missing  # noqa: E402
from status.runprog import start_in_container  # noqa: E402

DFLASHCTL = Path(sys.executable).parent / "dflashctl"


class LatencyRelay:
    """127.0.0.1:port → upstream, each chunk delivered `delay` seconds after it arrived (order kept)."""

    def __init__(self, upstream: tuple[str, int], delay: float) -> None:
        self.upstream, self.delay = upstream, delay
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.port = 0

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            server = self.loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            self.loop.run_forever()

        threading.Thread(target=serve, daemon=True).start()
        ready.wait(10)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(*self.upstream)
        await asyncio.gather(self._pipe(reader, up_w), self._pipe(up_r, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        due: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                t, data = await due.get()
                await asyncio.sleep(max(0.0, t - self.loop.time()))
                if not data:
                    break
                writer.write(data)
                await writer.drain()
            writer.close()

        task = asyncio.ensure_future(deliver())
        try:
            while data := await reader.read(65536):
                due.put_nowait((self.loop.time() + self.delay, data))
        except ConnectionError:
            pass
        due.put_nowait((self.loop.time() + self.delay, b""))
        await task


def hosts_toml(path: Path, sshd: SshdServer, envs: list[PveEnv], port: int, persist: int) -> Path:
    parts = ['default = "pve1"\n']
    for i, env in enumerate(envs, 1):
        parts.append(f"[hosts.pve{i}]\ntransport = \"ssh\"\naddress = \"127.0.0.1\"\nport = {port}\nuser = \"root\"\n"
                     f"identity_file = {toml_str(str(sshd.client_key))}\ncontainer = {env.ctid}\n"
                     f"workspace = \"/workspace/dflash\"\npython = \"python3\"\npersist = {persist}\n")
    path.write_text("\n".join(parts))
    return path


def busy_s() -> float:
    """CPU seconds this whole machine has spent busy (every process: the client, sshd, the simulated hosts)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, dict]:
    """Wall seconds, machine-wide busy CPU seconds, and the JSON the command printed."""
    c, t = busy_s(), time.perf_counter()
    out = subprocess.run(argv, capture_output=True, env=env, timeout=300)
    dt = time.perf_counter() - t
    return dt, busy_s() - c, json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", default="1,4,16")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--delay-ms", type=float, default=25.0)
    ap.add_argument("--out", default=result_path("fanout.md"))
    args = ap.parse_args()
    if sshd_missing():
        return 2
    counts = [int(x) for x in args.hosts.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="dflash-fanout-"))
    sshd = SshdServer(tmp / "sshd").start()
    relay = LatencyRelay((sshd.address, sshd.port), args.delay_ms / 1000)
    known = tmp / "known_hosts"  # the sshd's key, also under the relay's port
    key = sshd.known_hosts.read_text().split(" ", 1)[1]
    known.write_text(sshd.known_hosts.read_text() + f"[127.0.0.1]:{relay.port} {key}")
    envs: list[PveEnv] = []
    rows = []
    try:
        for i in range(max(counts)):
            env = PveEnv(sshd, tmp / f"pve{i + 1}")
            envs.append(env)
            env.set_gpus([{"memory.used": 60000, "utilization.gpu": 95} for _ in range(8)])
            start_in_container(env, f"20261201-1200-fan{i + 1}", step_s=0.5)
        base = {**os.environ, **envs[0].env, "DFLASHCTL_KNOWN_HOSTS": str(known),
                "DFLASHCTL_STATE_DIR": str(tmp / "state")}
        time.sleep(2)  # every run has logged a few steps
        for persist in (0, 300):
            for n in counts:
                env = {**base, "DFLASHCTL_HOSTS": str(hosts_toml(tmp / f"hosts-{n}-{persist}.toml", sshd, envs[:n],
                                                                   relay.port, persist))}
                argv = [str(DFLASHCTL), "status", "--all", "--json"]
                if persist:
                    timed(argv, env)  # the masters start (untimed)
                times, cpus = [], []
                for _ in range(args.calls):
                    dt, cpu, doc = timed(argv, env)
                    assert len(doc["hosts"]) == n and all(h.get("verdict") for h in doc["hosts"]), doc
                    times.append(dt)
                    cpus.append(cpu)
                rows.append((persist, n, statistics.median(times), min(times), statistics.median(cpus)))
                print(f"  persist={persist} hosts={n}: median {rows[-1][2]:.3f} s", flush=True)
            subprocess.run([str(DFLASHCTL), "hosts", "disconnect"], env=env, capture_output=True, timeout=60)
    finally:
        for env in envs:
            env.close()
        sshd.stop()
    out = [f"# status --all fan-out: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {os.cpu_count()} CPUs, "
           f"load {os.getloadavg()[0]:.1f}",
           "",
           f"`benchmarks/fanout.py --calls {args.calls} --delay-ms {args.delay_ms:g}`: one sshd on 127.0.0.1 behind a "
           f"latency relay ({args.delay_ms:g} ms each way), one `pct` stand-in container with a live run per host; "
           "`dflashctl status --all --json`, a new process per call. Every host is played by this one machine.",
           "",
           f"The CPU column is what the whole machine spent per call; divided by its {os.cpu_count()} CPUs it is the "
           "floor "
           "no fan-out can beat here, since the simulated hosts' own work (sshd, pct, the probe, nvidia-smi) runs on "
           "the same CPUs — on real hosts it runs on theirs.",
           "",
           "| connection | hosts | median | min | × one host | machine CPU | CPU floor | median − floor |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for persist, n, med, mn, cpu in rows:
        one = next(r[2] for r in rows if r[0] == persist and r[1] == counts[0])
        floor = cpu / (os.cpu_count() or 1)
        label = "new ssh connection per host (persist = 0)" if persist == 0 else "warm connection masters"
        out.append(f"| {label} | {n} | {med:.3f} s | {mn:.3f} s | {med / one:.2f} | {cpu:.2f} s | {floor:.2f} s | "
                   f"{med - floor:.2f} s |")
    return publish(out, args.out)


if __name__ == "__main__":
    sys.exit(main())
