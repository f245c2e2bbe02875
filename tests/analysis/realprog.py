"""Run small real Python programs and return what they wrote: real tracebacks, not hand-typed ones."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run_program(source: str, *, timeout: float = 120) -> bytes:
    """stdout+stderr of `python -c source`, in the order written (one pipe, like a nohup'd train.log)."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
        check=False,
    )
    return proc.stdout


# Threads crash one after another (joined in turn) so the file is deterministic; the trainer's
# progress line is printed in between, from the main thread.
SEQUENTIAL_THREAD_CRASHES = """
import sys, threading
sys.stderr = sys.stdout
def drafter(i):
    def step():
        return {}["block-%d" % i]
    try:
        step()
    except KeyError as e:
        raise RuntimeError("drafter %d lost its block" % i) from e
for s in range(3):
    print("step=%d loss=%.4f tok/s=1834.2 lr=3.00e-04 acc=0.123 acc_len=2.5" % (s, 4.0 - s / 10), flush=True)
for i in range(3):
    t = threading.Thread(target=drafter, args=(i,), name="drafter-%d" % i)
    t.start(); t.join()
    print("step=%d loss=3.5000 tok/s=1500.0 lr=3.00e-04 acc=0.2" % (3 + i), flush=True)
"""

# Real torch: a dynamo-optimized function traced by FX, in a thread named like the seed's drafters.
# The same RuntimeError the seed's drafter threads died of, produced cheaply (backend="eager").
TORCH_FX_RACE = """
import sys, threading, torch
sys.stderr = sys.stdout
@torch.compile(backend="eager")
def g(x):
    return x * 2 + 1
class M(torch.nn.Module):
    def forward(self, x):
        return g(x)
def work():
    torch.fx.symbolic_trace(M())
print("step=1 loss=4.1234 tok/s=1834.2 lr=3.00e-04 acc=0.123", flush=True)
t = threading.Thread(target=work, name="drafter-0"); t.start(); t.join()
"""


# The seed's run, for real: the coordinator logs steps, then three drafter threads die in torch.compile
# with the FX-tracing error (one after another, so the recording is deterministic). The recorded copy in
# data/seed_train.log was made with: python -c "from analysis.realprog import *; record_seed()" (cwd tests/).
SEED_RUN = """
import sys, threading, torch
sys.stderr = sys.stdout
@torch.compile(backend="eager")
def block_forward(x):
    return torch.nn.functional.gelu(x) * 2
class Drafter(torch.nn.Module):
    def forward(self, x):
        return block_forward(x)
def drafter_main():
    torch.fx.symbolic_trace(Drafter())
print("loading target on cuda:0-4, drafters on cuda:5-7", flush=True)
for s in range(1, 4):
    print("step=%d loss=%.4f tok/s=1834.2 lr=3.00e-04 acc=0.123" % (s, 4.5 - s / 10), flush=True)
for i in range(3):
    t = threading.Thread(target=drafter_main, name="drafter-%d" % i)
    t.start(); t.join()
"""


def record_seed() -> None:
    from pathlib import Path

    out = run_program(SEED_RUN, timeout=300)
    (Path(__file__).parent / "data" / "seed_train.log").write_bytes(out)
