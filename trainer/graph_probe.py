"""Start-up probe: can the installed torch capture inductor CUDA graphs (mode="reduce-overhead") from Python
threads, as the drafter threads would? Inductor's CUDA-graph trees failed from non-main threads (pytorch#123177,
fixed only in recent builds), so `runtime.cuda_graphs = true` is honoured only where this probe passes.

What it checks, on the device the drafters use: a small compiled MLP (forward + backward, fixed shapes) run from a
worker thread three times (warm-up, record, replay), its loss and gradients equal to eager's within fp32 tolerance,
and the CUDA memory the graph pools hold afterwards (reserved bytes before/after, the cost graphs add per device).
On the CPU there are no CUDA graphs: the verdict is "not applicable".
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass
class GraphProbe:
    verdict: str
    """"safe", "unsafe" or "not applicable"."""
    detail: str
    pool_mib: float = 0.0
    """CUDA memory reserved by the captured graphs' private pools (0 off CUDA)."""

    @property
    def safe(self) -> bool:
        return self.verdict == "safe"

    def line(self, device: str) -> str:
        """The log line (one per run; `cuda_graphs_probe` is what `grep` finds)."""
        mem = f" pool_mib={self.pool_mib:.1f}" if self.verdict != "not applicable" else ""
        return f"cuda_graphs_probe device={device} verdict={self.verdict.replace(' ', '-')}{mem} detail={self.detail}"


def probe(device: str) -> GraphProbe:
    """Run the probe on `device` (see the module docstring); never raises."""
    if not device.startswith("cuda"):
        return GraphProbe("not applicable", "no CUDA graphs on the CPU")
    import torch

    if not torch.cuda.is_available():
        return GraphProbe("not applicable", "CUDA is not available")
    result: dict[str, object] = {}

    def body() -> None:
        try:
            result["value"] = _capture_in_thread(torch, torch.device(device))
        except Exception as e:  # the failure is the finding
            lines = str(e).strip().splitlines() or [""]
            result["error"] = f"{type(e).__name__}: {lines[0][:200]}"

    t = threading.Thread(target=body, name="cuda-graph-probe")
    t.start()
    t.join()
    if "error" in result:
        return GraphProbe("unsafe", str(result["error"]))
    ok, why, pool = result["value"]  # type: ignore[misc]
    return GraphProbe("safe" if ok else "unsafe", why, pool)


def _capture_in_thread(torch, dev) -> tuple[bool, str, float]:  # noqa: ANN001 - torch passed in, imported lazily
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).to(dev)
    x = torch.randn(64, 256, device=dev)

    def step(m, inp):  # noqa: ANN001, ANN202
        return m(inp).square().mean()

    ref = step(net, x)
    ref.backward()
    ref_grads = [p.grad.clone() for p in net.parameters()]
    torch.cuda.synchronize(dev)
    before = torch.cuda.memory_reserved(dev)
    compiled = torch.compile(step, mode="reduce-overhead")
    for _ in range(3):  # warm-up, record, replay
        net.zero_grad(set_to_none=True)
        loss = compiled(net, x)
        loss.backward()
    torch.cuda.synchronize(dev)
    pool = (torch.cuda.memory_reserved(dev) - before) / 2**20
    same = torch.allclose(loss, ref, rtol=1e-4, atol=1e-5) and all(
        torch.allclose(p.grad, g, rtol=1e-3, atol=1e-5) for p, g in zip(net.parameters(), ref_grads, strict=True))
    return same, ("captured and replayed from a thread, matches eager" if same
                  else "replayed from a thread but differs from eager"), pool
