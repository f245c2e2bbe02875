"""The probe's GPU reading per sample with the health fields on, beside the memory/utilisation-only reading it
replaced, on both paths, and the laptop's reading of it. Results: benchmarks/results/gpu_probe_cost.md (+ .json).

    .venv/bin/python benchmarks/gpu_probe_cost.py [--real-only] [--samples N] [--smi-samples N] [--out FILE.md]

(a) nvidia-smi: the old query (SMI_QUERY, as agent/probe/gpus.py ran it before) vs SMI_QUERY + SMI_HEALTH by a SmiQuery
    kept (a --watch) and a fresh one per sample (gpu_report() without a reader: the sentinel, the restart wait).
(b) NVML: the pre-health reading (init, handles, 5 calls per GPU, shutdown, every sample), the same fields with handles
    kept, health by a fresh GpuReader per sample and by a kept one; calls counted by a proxy of the bindings (and the
    fake's CALLS); the bindings' own time: the call sequence replayed on them, less the loop's (timed on a no-op).
(c) the laptop: the piece's JSON -> report.parse_gpus -> gpus.from_probe [+ gpuhealth.gpu_health + health_findings].
No GPU: tests/harness/gpu/nvidia-smi (8 H100s; `python3 -S`, python3 linked to this interpreter) and
tests/harness/fakes/pynvml. A real GPU (nvmlInit works / a real nvidia-smi on PATH) is measured too, NVML against
nvidia-smi; --real-only skips the stand-ins.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dflashctl.agent.probe.gpus import SMI_HEALTH, SMI_QUERY, GpuReader, SmiQuery, gpu_report  # noqa: E402
from dflashctl.agent.probe.nvml import NvmlReader, _nvml_text  # noqa: E402
from dflashctl.analysis.gpuhealth import gpu_health, health_findings  # noqa: E402
from dflashctl.analysis.gpus import from_probe  # noqa: E402
from dflashctl.report import parse_gpus  # noqa: E402

STANDIN = ROOT / "tests" / "harness" / "gpu" / "nvidia-smi"
FAKES = ROOT / "tests" / "harness" / "fakes"
SMI_GPUS = [{"index": i, "memory.used": 70000 + 100 * i, "utilization.gpu": 97, "power.draw": 650.0 + i}
            for i in range(8)]
SICK = [dict(g, **{"clocks_event_reasons.active": "0x0000000000000004"},  # all power-capped, GPU 2 ECC errors too
             **({"ecc.errors.uncorrected.volatile.total": 3} if g["index"] == 2 else {})) for g in SMI_GPUS]
NVML_GPUS = [{"memory_used_mib": 70000 + 100 * i, "utilization_pct": 97, "power_w": 650.0 + i} for i in range(8)]
P90 = lambda xs: statistics.quantiles(xs, n=10, method="inclusive")[8]  # noqa: E731
OPEN: list = []  # the kept readers, closed after their table


def before_read(lib) -> list:  # noqa: ANN001 - the pre-health probe's _nvml() (git show b137983^:…/probe/gpus.py)
    lib.nvmlInit()
    try:
        out = []
        for i in range(lib.nvmlDeviceGetCount()):
            h = lib.nvmlDeviceGetHandleByIndex(i)
            mem, name, uuid = lib.nvmlDeviceGetMemoryInfo(h), lib.nvmlDeviceGetName(h), lib.nvmlDeviceGetUUID(h)
            try:
                util = float(lib.nvmlDeviceGetUtilizationRates(h).gpu)
            except lib.NVMLError:
                util = None
            try:
                power = lib.nvmlDeviceGetPowerUsage(h) / 1000.0
            except lib.NVMLError:
                power = None
            out.append({"index": i, "uuid": _nvml_text(uuid), "name": _nvml_text(name), "memory_used_mib": mem.used
                        / 1048576, "memory_total_mib": mem.total / 1048576, "utilization_pct": util, "power_w": power})
        return out
    finally:
        lib.nvmlShutdown()


class BaseFieldsReader(NvmlReader):  # the health fields off: name/uuid once, then memory, utilisation, power
    def _read_device(self, index: int, dev: list) -> dict:
        lib, h, static = self.lib, dev[0], dev[1]
        rec: dict = {"index": index, "error": None, "unsupported": [], "field_errors": {}}
        for key, fn in (("name", lib.nvmlDeviceGetName), ("uuid", lib.nvmlDeviceGetUUID)):
            if key not in static and (value := self._call(rec, key, fn, h)) is not None:
                static[key] = _nvml_text(value)
            rec[key] = static.get(key)
        mem = self._call(rec, "memory_used_mib", lib.nvmlDeviceGetMemoryInfo, h)
        util = self._call(rec, "utilization_pct", lib.nvmlDeviceGetUtilizationRates, h)
        power = self._call(rec, "power_w", lib.nvmlDeviceGetPowerUsage, h)
        rec.update(memory_used_mib=mem.used / 1048576.0 if mem else None, utilization_pct=float(util.gpu) if util
                   else None, memory_total_mib=mem.total / 1048576.0 if mem else None,
                   power_w=power / 1000.0 if power is not None else None)
        return rec


class Counting:  # the bindings with every nvml* call recorded as [function, args, name, result]
    def __init__(self, lib) -> None:  # noqa: ANN001
        self._lib, self.calls = lib, []

    def __getattr__(self, name: str):  # noqa: ANN204
        value = getattr(self._lib, name)
        if not (name.startswith("nvml") and callable(value)):
            return value

        def call(*args):  # noqa: ANN002, ANN202
            self.calls.append(entry := [value, args, name, None])
            entry[3] = value(*args)
            return entry[3]
        return call


def replay(seq: list, noop: bool = False) -> Callable[[], None]:
    """The calls straight on the bindings (noop: the loop alone), with the handles this sequence acquires itself."""
    made = [e[3] for e in seq if e[2] == "nvmlDeviceGetHandleByIndex"]
    slot = {id(h): k for k, h in enumerate(made)}
    plan = [((lambda *a: None) if noop else fn, args, name == "nvmlDeviceGetHandleByIndex",
             slot.get(id(args[0])) if args else None) for fn, args, name, _r in seq]

    def run() -> None:
        hs: list = []
        for fn, args, acquires, k in plan:
            try:
                r = fn(*args) if k is None else fn(hs[k], *args[1:])
            except Exception:  # noqa: BLE001 - an unsupported field raises as it did when recorded
                r = None
            if acquires:
                hs.append(r)
    return run


def measure(fns: dict[str, Callable[[], object]], n: int, warmup: int = 2) -> dict[str, dict]:
    """Round-robin: wall, this process's CPU, its children's CPU per sample and variant; their medians / p90s."""
    for f in list(fns.values()) * warmup:
        f()
    raw, last = {k: {"wall": [], "cpu": [], "child": []} for k in fns}, {}
    for _ in range(n):
        for k, f in fns.items():
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            c0, t0 = time.process_time(), time.perf_counter()
            last[k] = f()
            t1, c1 = time.perf_counter(), time.process_time()
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            for m, x in zip(raw[k], (t1 - t0, c1 - c0, r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime),
                            strict=True):
                raw[k][m].append(x)
    out = {}
    for k, o in raw.items():
        o["total"] = [a + b for a, b in zip(o["cpu"], o["child"], strict=True)]
        out[k] = {f"{m}_{s}": f(o[m]) for m in o for s, f in (("med", statistics.median), ("p90", P90))}
        out[k].update(last=last[k], samples={m: [round(x, 7) for x in o[m]] for m in ("wall", "cpu", "child")})
    return out


def smi_old() -> dict:  # (a) nvidia-smi: the pre-health probe's call, as it was
    res = subprocess.run(["nvidia-smi", "--query-gpu=" + SMI_QUERY, "--format=csv,nounits"],
                         stdin=subprocess.DEVNULL, capture_output=True, timeout=20)
    assert res.returncode == 0, res.stderr
    return {"source": "nvidia-smi", "nvml": [], "smi_csv": res.stdout.decode("utf-8", "replace"), "error": None}


def smi_piece(q: SmiQuery) -> dict:
    csv, why = q.run()
    assert csv is not None, why
    return {"source": "nvidia-smi", "nvml": [], "smi_csv": csv, "error": None, "smi_missing": list(q.missing)}


SMI_ROWS = (("old query: SMI_QUERY only (before the health fields)", lambda: smi_old),
            ("health: + SMI_HEALTH, SmiQuery kept (a --watch)", lambda: (lambda q: lambda: smi_piece(q))(SmiQuery())),
            ("health: + SMI_HEALTH, a fresh SmiQuery per sample (gpu_report())", lambda: lambda: smi_piece(SmiQuery())))


def smi_table(driver: str, n: int) -> list[dict]:
    calls = []
    with mock.patch.object(subprocess, "run", wraps=subprocess.run) as run:
        for _label, make in SMI_ROWS:
            f = make()
            c = [run.call_count, f(), run.call_count, f(), run.call_count]  # before, 1st sample, after, 2nd, after
            calls.append((c[2] - c[0], c[4] - c[2]))
    res = measure({label: make() for label, make in SMI_ROWS}, n)
    return [dict(res[label], label=label, who=driver, vs=0, calls=calls[i], bytes=len(json.dumps(res[label]["last"])))
            for i, (label, _) in enumerate(SMI_ROWS)]


NVML_PIECE = {"source": "nvml", "nvml": [], "smi_csv": None, "error": None}  # (b) NVML
NVML_ROWS = (  # label, make(bindings) -> one sample, the row it is compared with
    ("before: init + handles + memory/util/power + shutdown, each sample",
     lambda lib: lambda: dict(NVML_PIECE, nvml=before_read(lib)), 0),
    ("memory/util/power only, handles kept (health off)",
     lambda lib: (lambda r: OPEN.append(r) or (lambda: dict(NVML_PIECE, nvml=r.read(), smi_missing=[])))(
         BaseFieldsReader(lib)), 0),
    ("health, a fresh GpuReader each sample (gpu_report(): handles re-acquired)", lambda lib: gpu_report, 0),
    ("health, GpuReader kept (a --watch: handles kept)", lambda lib: (lambda r: OPEN.append(r) or r.report)(
        GpuReader()), 1),
)


def nvml_table(lib, name: str, n: int) -> list[dict]:  # noqa: ANN001
    fake_calls, proxy, counts, seqs = getattr(lib, "CALLS", None), Counting(lib), [], []
    sys.modules["pynvml"] = proxy  # what `import pynvml` in GpuReader gives, meanwhile
    for _label, make, _vs in NVML_ROWS:
        f, fake0, n0 = make(proxy), sum(fake_calls.values()) if fake_calls is not None else 0, len(proxy.calls)
        c = [f(), len(proxy.calls), f(), len(proxy.calls)]  # 1st sample, after it, 2nd, after it
        seqs.append(proxy.calls[c[1]:])
        counts.append(((c[1] - n0, c[3] - c[1]), dict(Counter(e[2] for e in seqs[-1]))))
        if fake_calls is not None:  # the fake's own count agrees with the proxy's
            assert sum(fake_calls.values()) - fake0 == c[3] - n0, (c, n0)
    sys.modules["pynvml"] = lib
    fns = {label: make(lib) for label, make, _vs in NVML_ROWS}
    for (label, _m, _v), seq in zip(NVML_ROWS, seqs, strict=True):
        fns.update({"replay: " + label: replay(seq), "no-op: " + label: replay(seq, noop=True)})
    res = measure(fns, n)
    del sys.modules["pynvml"]
    while OPEN:
        OPEN.pop().close()
    rows = []
    for i, (label, _make, vs) in enumerate(NVML_ROWS):
        last = res[label]["last"]
        assert last["source"] == "nvml" and len(last["nvml"]) == counts[i][1].get("nvmlDeviceGetMemoryInfo"), last
        b = res["replay: " + label]["wall_med"] - res["no-op: " + label]["wall_med"]
        rows.append(dict(res[label], label=label, who=name, vs=vs, calls=counts[i][0], calls_by_name=counts[i][1],
                         bindings_med=b, ours_med=res[label]["wall_med"] - b, bytes=len(json.dumps(last))))
    return rows


def laptop(text: str, health: bool) -> tuple[int, int | None]:  # (c)
    rep = parse_gpus(json.loads(text))
    return len(from_probe(rep)[0] or ()), len(health_findings(gpu_health(rep))) if health else None


def parse_inputs(out: list, smi: list[dict] | None, nvml: list[dict] | None, sick: dict | None = None) -> None:
    if smi:
        k, csv = len(out), f"{smi[0]['who']}, health CSV"
        out += [(f"{smi[0]['who']}, old CSV: from_probe", smi[0]["last"], False, k),
                (f"{csv}: from_probe only", smi[1]["last"], False, k),
                (f"{csv}: from_probe + gpu_health + health_findings", smi[1]["last"], True, k)]
        out += [(f"{csv}, all 8 power-capped, GPU 2 with ECC errors: the same", sick, True, k)] if sick else []
    if nvml:
        k, who = len(out), nvml[0]["who"]
        out += [(f"{who}, old records: from_probe", nvml[0]["last"], False, k),
                (f"{who}, health records: from_probe + gpu_health + health_findings", nvml[3]["last"], True, k)]


def parse_table(inputs: list, n: int) -> list[dict]:
    texts = {label: json.dumps(piece) for label, piece, _h, _vs in inputs}
    res = measure({label: (lambda t=texts[label], h=h: laptop(t, h)) for label, _p, h, _vs in inputs}, n)
    return [dict(res[label], label=label, vs=vs, bytes=len(texts[label]), gpus=res[label]["last"][0],
                 findings=res[label]["last"][1]) for label, _p, _h, vs in inputs]


def real_nvml() -> tuple[object | None, str]:
    try:
        lib = importlib.import_module("pynvml")  # the installed bindings: the fakes are not on sys.path yet
        lib.nvmlInit()
    except ImportError as e:
        return None, f"pynvml not importable ({e})"
    except lib.NVMLError as e:
        return None, f"pynvml imports, nvmlInit fails ({type(e).__name__}: {e})"
    try:
        n, drv = lib.nvmlDeviceGetCount(), _nvml_text(lib.nvmlSystemGetDriverVersion())
    finally:
        lib.nvmlShutdown()
    return (lib, f"NVML: {n} GPUs, driver {drv}") if n else (None, "NVML works but sees no GPU")


def real_smi(path: str) -> tuple[str | None, str]:
    if (exe := shutil.which("nvidia-smi", path=path)) is None or Path(exe).resolve() == STANDIN.resolve():
        return None, "no nvidia-smi on PATH" if exe is None else "the nvidia-smi on PATH is the test stand-in"
    res = subprocess.run([exe, "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=60, check=False)
    lines = res.stdout.strip().splitlines()
    if res.returncode or not lines:
        return None, f"nvidia-smi exit {res.returncode}: {(res.stdout + res.stderr).strip()[-200:]}"
    return exe, f"nvidia-smi: {len(lines)} GPUs ({lines[0]})"


def load_fake():  # noqa: ANN201 - tests/harness/fakes first on sys.path, its pynvml imported, the path restored
    sys.modules.pop("pynvml", None)  # the installed one (real_nvml's): kept by the caller
    sys.path.insert(0, str(FAKES))
    fake = importlib.import_module("pynvml")
    assert Path(fake.__file__).resolve().is_relative_to(FAKES), fake.__file__
    fake.configure({"gpus": NVML_GPUS})  # (it finds itself in sys.modules)
    sys.path.remove(str(FAKES))
    del sys.modules["pynvml"]
    return fake


def stand_in_tables(n: int) -> tuple[list[list[dict]], dict]:
    tmp, path = Path(tempfile.mkdtemp(prefix="dflash-gpu-probe-bench-")), os.environ.get("PATH", "")
    (tmp / "nvidia-smi").symlink_to(STANDIN)
    (tmp / "python3").symlink_to(os.path.realpath(sys.executable))  # the stand-in's `env -S python3 -S`
    os.environ.update(PATH=f"{tmp}:{path}", DFLASH_FAKE_GPUS=str(tmp / "gpus.json"))
    try:
        tables = []
        for driver in ("580.173.02", "470.256.02"):
            (tmp / "gpus.json").write_text(json.dumps({"frames": [SMI_GPUS], "driver": driver}))
            tables.append(smi_table(f"nvidia-smi stand-in ({driver})", n))
        (tmp / "gpus.json").write_text(json.dumps({"frames": [SICK]}))
        return tables, smi_piece(SmiQuery())
    finally:
        os.environ["PATH"] = path
        shutil.rmtree(tmp)


HEAD = {"who": "driver / bindings", "label": "reading", "calls": "calls (first / then)", "wall_med": "wall median",
        "wall_p90": "wall p90", "cpu_med": "CPU ours", "cpu_p90": "CPU ours p90", "child_med": "CPU nvidia-smi",
        "total_med": "CPU total", "total_p90": "CPU total p90", "bindings_med": "bindings' own", "ours_med": "ours",
        "bytes": "piece bytes", "gpus": "GPUs", "findings": "findings", "vs": "vs"}


def table(rows: list[dict], keys: str, unit: str) -> list[str]:
    """One row per dict, numbered per `who` (tables stacked); `÷key`: key's ratio to the row named in `vs`."""
    keys_, r2 = keys.split(), lambda a, b: "—" if b <= 0 else f"{a / b:.2f}" if a >= b / 10 else f"{a / b:.2g}"
    fmt = (lambda x: f"{x * 1e3:.2f} ms") if unit == "ms" else (lambda x: f"{x * 1e6:.1f} µs")
    out = ["| # | " + " | ".join(HEAD[k[1:]] + " ÷ vs" if k[0] == "÷" else HEAD[k] for k in keys_) + " |",
           "|---|" + "---|" * len(keys_)]
    base = 0
    for i, r in enumerate(rows):
        base = i if i and r.get("who") != rows[i - 1].get("who") else base
        b = rows[base + r["vs"]]
        out.append(f"| {i - base + 1} | " + " | ".join(
            r2(r[k[1:]], b[k[1:]]) if k[0] == "÷" else fmt(r[k]) if k.endswith(("_med", "_p90")) else
            "{} / {}".format(*r[k]) if k == "calls" else str(r[k] + 1) if k == "vs" else
            "—" if r.get(k) is None else str(r[k]) for k in keys_) + " |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--real-only", action="store_true", help="skip the stand-ins: measure the real GPU paths only")
    ap.add_argument("--samples", type=int, default=200, help="samples per in-process variant (NVML, the laptop)")
    ap.add_argument("--smi-samples", type=int, default=30, help="samples per nvidia-smi variant (subprocesses)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_probe_cost.md"))
    args = ap.parse_args()
    cmd = ".venv/bin/python benchmarks/gpu_probe_cost.py" + "".join(f" {a}" for a in sys.argv[1:])
    t0, load0 = time.monotonic(), os.getloadavg()
    (real_lib, nvml_note), (real_exe, smi_note) = real_nvml(), real_smi(os.environ.get("PATH", ""))
    real = f"{nvml_note}; {smi_note}" if real_lib or real_exe else f"no real GPU here ({nvml_note}; {smi_note})"
    print(real, flush=True)
    if args.real_only and not (real_lib or real_exe):
        return 2
    smi, nvml, inputs = [], [], []
    if not args.real_only:
        smi[:], sick = stand_in_tables(args.smi_samples)
        nvml.append(nvml_table(load_fake(), "fake pynvml", args.samples))
        parse_inputs(inputs, smi[0], nvml[0], sick)
    if real_exe:
        smi.append(smi_table("real nvidia-smi", args.smi_samples))
    if real_lib:
        nvml.append(nvml_table(real_lib, "real NVML", args.samples))
    if real_exe or real_lib:
        parse_inputs(inputs, smi[-1] if real_exe else None, nvml[-1] if real_lib else None)
    laptop_rows = parse_table(inputs, args.samples)
    by_name = "; ".join(f"row {i + 1}: " + ", ".join(f"{k.removeprefix('nvmlDevice')} {v}" for k, v in nvml[0][i][
        "calls_by_name"].items()) for i in (0, 3)) if nvml else "—"
    out = [
        "# The probe's GPU reading: health fields on vs memory/utilisation only, per sample", "",
        f"Command: `{cmd}`  ", f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {platform.platform()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, load {load0[0]:.2f} → {os.getloadavg()[0]:.2f}, "
        f"wall {time.monotonic() - t0:.0f} s. Real GPU: {real}.  ",
        f"8 GPUs. {args.smi_samples} samples per nvidia-smi variant, {args.samples} per in-process one, after 2 "
        "warm-up samples, round-robin (each sample runs every variant of its table once); median and p90 over them. "
        f"The health fields: {len(SMI_HEALTH)} nvidia-smi columns beside SMI_QUERY's {len(SMI_QUERY.split(','))}.", "",
        "- **wall**: time.perf_counter per sample; **CPU ours**: time.process_time (this process); **CPU nvidia-smi**: "
        "its children's (getrusage(RUSAGE_CHILDREN) delta); **CPU total**: both.",
        "- **calls (first / then)**: nvidia-smi processes / NVML calls on a fresh reader's first sample / each later.",
        "- **bindings' own**: the row's NVML calls replayed straight on the bindings, less that loop over a no-op; "
        "**ours**: wall − bindings' own (our Python: NvmlReader, GpuReader, the records).",
        "- **piece bytes**: the `gpus` piece as JSON (what crosses to the laptop); **vs**: the row it is compared with "
        "(same table, same run); **X ÷ vs**: this row's median ÷ that row's.", "",
        "## (a) nvidia-smi path: a subprocess per call", "",
        *table([r for t in smi for r in t], "who label calls wall_med wall_p90 cpu_med child_med total_med total_p90 "
               "bytes vs ÷wall_med ÷cpu_med ÷total_med", "ms"), "",
        "Whose figures: with the stand-in, wall and CPU nvidia-smi are the stand-in's (most of it a Python start-up), "
        "not a real nvidia-smi's. Holding on a real driver: calls per sample, bytes, roughly CPU ours (spawn, pipes).",
        "",
        "## (b) NVML path: in-process", "",
        *table([r for t in nvml for r in t], "who label calls wall_med wall_p90 cpu_med cpu_p90 bindings_med ours_med "
               "bytes vs ÷wall_med ÷cpu_med ÷ours_med", "us"), "",
        "Whose figures: with the fake, bindings' own is the fake's Python, not a driver's. Holding on a real driver: "
        f"NVML calls per sample (each a driver call) and ours. Calls per later sample: {by_name}.",
        "", "## (c) the laptop's side: the `gpus` piece → readings (+ health findings), 8 GPUs", "",
        *table(laptop_rows, "label bytes gpus findings wall_med wall_p90 cpu_med cpu_p90 vs ÷wall_med ÷cpu_med", "us"),
        "", "Whose figures: all ours, the same on a real driver's output (the stand-in prints nvidia-smi's real "
        "formats; NVML records are the probe's own dicts). Paid per GPU reading the laptop reads."]
    if real_exe and real_lib:  # each NVML row against its nvidia-smi one
        h2h = [dict(x, label=f"{x['who']}: {x['label']}", who="real", vs=2 * k) for k, (i, j) in
               enumerate(((0, 0), (1, 3), (2, 2))) for x in (smi[-1][i], nvml[-1][j])]
        out += ["", "## (r) real GPU: NVML against nvidia-smi (`vs`: the same reading by nvidia-smi)", "", *table(
            h2h, "label calls wall_med wall_p90 total_med total_p90 vs ÷wall_med ÷total_med", "ms")]
    text = "\n".join(out) + "\n"
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    Path(args.out).with_suffix(".json").write_text(json.dumps(
        {"command": cmd, "real": real, "smi": smi, "nvml": nvml, "laptop": laptop_rows}, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
