"""Known failures: a stable id (JSON contract, DESIGN §5), how to recognise it, what to do about it.

One table drives three things: the log scanner's per-line matching (`LINE_RULES`), the judgement of
finished tracebacks (`match_traceback`: exception type and frames), and `docs/failures.md`
(failuredocs.py; a test keeps the file in sync).

Rules are deliberately specific: healthy logs say `error_rate=`, `NaN check passed` and `retrying`
all the time, and a false alarm trains people to ignore the tool. A rule's shape is sigrule.Rule; the torch.compile
family's rules live in sigcompile.py (kept here in DESIGN's order).
"""

from __future__ import annotations

import re

from dflashctl.analysis.sigcompile import CACHE_PATH_RE as CACHE_PATH_RE
from dflashctl.analysis.sigcompile import (
    COMPILE_THREAD_RACE,
    INDUCTOR_CACHE_CORRUPT,
    NATIVE_COMPILE,
    RECOMPILE_LIMIT,
    TRITON_COMPILE,
)
from dflashctl.analysis.sigrule import Rule as Rule
from dflashctl.analysis.sigrule import sig

ZERO_RUN = 3  # consecutive training losses of exactly 0.0 that make a `zero-loss`

# bash's own translations of its job message "Killed" (its message catalogue, bash.mo): a shell in a Chinese, German or
# Korean locale prints `已杀死`, `Abgebrochen (Killed)`, `죽었음` where English prints `Killed` when the kernel's OOM
# killer ends the program (issue 28: the held-out logs had one). The catalogue's all-ASCII words (es `Matado`, it
# `Ucciso`, pl `Unicestwiony`, …) are left out: each would be one more common-letter anchor for every scan to look for.
BASH_KILLED = ("Killed", "Abgebrochen (Killed)", "Morto (Killed)", "Bị giết", "Dödad", "Geëlimineerd", "Kilőve",
               "Omorât", "Slået ihjel", "Tué", "Uničen", "Zabitý", "Öldürüldü", "Вбитий", "Убит", "Убијен", "已杀死",
               "強制結束", "죽었음")
# a line that is only that message (markdown bold around it kept: users paste `**Killed**`); spaces stay unescaped so
# each word is literally in the pattern, as its anchor must be
_BASH_KILLED_LINE = (r"^[*_]{0,2}(?:"
                     + "|".join(re.escape(w).replace("\\ ", " ") for w in sorted(BASH_KILLED, key=len, reverse=True))
                     + r")\.?[*_]{0,2}\s*$")
# CUDA's stream-capture error strings (cudaErrorStreamCapture*, 900-908, as cudaGetErrorString words them), whoever
# prints them: torch's `CUDA error: …`, NCCL's `NCCL WARN Cuda failure '…'`, Warp's `CUDA error 900: …`, TensorRT's
# `Cuda Runtime (…)`. The ones with their own pattern below (900, 906) are not repeated.
_CAPTURE_ERRORS = (r"operation failed due to a previous error during capture",
                   r"operation would result in a merge of separate capture sequences",
                   r"capture was not ended in the same stream as it began",
                   r"capturing stream has unjoined work",
                   r"dependency created on uncaptured work in another stream",
                   r"operation not permitted on an event last recorded in a capturing stream",
                   r"attempt to terminate a thread-local capture sequence from another thread")


RULES: tuple[Rule, ...] = (
    COMPILE_THREAD_RACE,
    Rule(
        sig(
            "cuda-oom",
            "A GPU ran out of memory.",
            "Lower the batch or sequence length, or move the drafter/target to GPUs with free memory; "
            "check `dflashctl kill-zombies` first: a process of an earlier run may still hold the memory. "
            "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` helps with fragmentation.",
        ),
        lines=(r"CUDA out of memory", r"CUDA (?:driver )?error: out of memory", r"HIP out of memory",
               r"HIP error: out of memory", r"CUBLAS_STATUS_ALLOC_FAILED", r"CUDA_ERROR_OUT_OF_MEMORY",
               r"THCudaCheck FAIL .{0,200}out of memory",
               r"cudaErrorMemoryAllocation",
               # the message's tail without its head (a cut paste, a wrapped line): only the OOM message says these
               r"Tried to allocate \d+(?:\.\d+)? [KMGT]i?B \(GPU \d+; \d+(?:\.\d+)? [KMGT]i?B total capacity",
               r"Tried to allocate \d+(?:\.\d+)? [KMGT]i?B\. GPU \d+ has a total capaci?ty of",  # 2.1 wrote `capacty`
               r"If reserved but unallocated memory is large try setting"),
        exc_types=("OutOfMemoryError",),
        examples=("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 5 has a total "
                  "capacity of 79.11 GiB of which 1.06 GiB is free.",
                  "Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.21 GiB already allocated; "
                  "4.75 MiB free; 14.54 GiB reserved in total by PyTorch)"),
    ),
    Rule(
        sig(
            "host-oom",
            "The host (container) ran out of RAM.",
            "Reduce data-loader workers, prefetch depth or pinned-memory buffers, or raise the container's "
            "memory limit (`pct set CTID -memory MB`); `dmesg` on the Proxmox host names the OOM-killed process.",
        ),
        lines=(r"DefaultCPUAllocator: can't allocate memory", r"(?i:out of memory): Killed process",
               r"Out of memory: Kill process",
               r"Cannot allocate memory \(errno 12\)", r"\boom-kill:constraint=CONSTRAINT_",
               _BASH_KILLED_LINE, r"(?:^|\s)\d+\s+Killed\s+\S",
               # the kernel's line without its `Out of memory:` head (older kernels, a cgroup's own wording cut)
               r"\bKilled process \d+ \([^)]*\) total-vm:",
               # signal 9 as other launchers and schedulers say it: accelerate's `died with <Signals.SIGKILL: 9>`, an
               # IDE's `exit code 137 (interrupted by signal 9: SIGKILL)`, Slurm's OOM kill, Kubernetes' OOMKilled
               r"<Signals\.SIGKILL: 9>", r"(?i:signal) 9: SIGKILL", r"oom_kill events? in StepId",
               r"tasks? have been OOM Killed", r"task \d+: Out Of Memory\b",
               r"(?:[Rr]eason\"?:\s*\"?|\s\d+/\d+\s+)OOMKilled\b",  # a pod's `Reason: OOMKilled`, `kubectl get pods`
               r"(?i:signal) 9 \(SIGKILL\) received by PID",
               r"DataLoader (?:worker|process) \(pid\(?s?\)? ?[\d, ]*\)? ?(?:exited )?is killed by signal: Killed"),
        exc_types=("MemoryError",),
        death="kill",
        examples=("RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate "
                  "memory: you tried to allocate 68719476736 bytes. Error code 12 (Cannot allocate memory)",),
    ),
    Rule(
        sig(
            "nccl-timeout",
            "A collective operation timed out (one rank hung or died; the others waited).",
            "Find the rank that stopped first (its log ends earliest); set `TORCH_NCCL_ASYNC_ERROR_HANDLING=1` "
            "so hangs fail fast, and `NCCL_DEBUG=INFO` to see which collective hung.",
        ),
        lines=(r"Watchdog caught collective\b",  # the watchdog catches nothing else; a log cut mid-word says it too
               r"NCCL\b.{0,80}\b(?i:time[d ]?out)\b(?! set)",
               r"ProcessGroupNCCL.{0,120}Timeout\(ms\)=",
               r"Timed out waiting \d+ ?ms for (?:recv|send) operation to complete",  # gloo
               r"Heartbeat monitor timed out", r"ProcessGroupNCCL's watchdog got stuck for \d+ seconds",
               r"Some NCCL operations have failed or timed out",
               r"failed to pass monitoredBarrier in \d+ ms",
               r"DistBackendError: (?!.{0,300}(?:store|ncclUniqueId)).{0,300}?(?i:timed out|timeout|timing out)"
               r"(?! set)",
               r"\bWork ran for \d+ milliseconds before timing out"),
        supersedes=("nccl-error",),  # a DistBackendError that says it timed out is the timeout, not an NCCL fault
        examples=("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, "
                  "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600005 milliseconds before timing out.",
                  "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                  "1800000ms for recv operation to complete"),
    ),
    Rule(
        sig(
            "nccl-error",
            "NCCL reported an error (transport, peer access or a CUDA failure inside NCCL).",
            "Run with `NCCL_DEBUG=INFO`; check `nvidia-smi topo -m` and that every GPU of the run is visible "
            "in the container; a crashed peer often shows up here first.",
        ),
        # `NCCL Error 2: unhandled system error`: torch before 1.0 numbered them (torch/cuda/nccl.py's NcclError)
        lines=(r"\bNCCL error\b", r"\bNCCL Error \d+: ",
               r"\bnccl(?:InternalError|SystemError|UnhandledCudaError|RemoteError|InvalidUsage)\b"),
        exc_types=("DistBackendError", "NcclError"),
        examples=("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
                  "NCCLUtils.hpp:275, unhandled cuda error, NCCL version 2.21.5",),
    ),
    Rule(
        sig(
            "cuda-illegal-access",
            "A kernel accessed memory it must not (illegal address, device-side assert, misaligned address).",
            "Rerun with `CUDA_LAUNCH_BLOCKING=1` to find the kernel; device-side asserts usually mean an index "
            "out of range (token ids ≥ vocab size, a bad mask); the CUDA context is unusable until restart.",
        ),
        lines=(r"CUDA error: an illegal memory access was encountered", r"CUDA error: device-side assert triggered",
               r"CUDA error: misaligned address", r"CUDA error: an illegal instruction was encountered",
               r"cudaErrorIllegalAddress", r"\.cuh?:\d+: .{0,300}Assertion `",
               r"CUDA error: an illegal memory access", r"Device-side assertion",
               # the same CUDA errors as Triton's launcher, ROCm and the driver API word them
               r"(?:Triton Error \[CUDA\]|HIP error): (?:an illegal memory access|device-side assert triggered|"
               r"misaligned address|an illegal instruction)",
               r"CUDA_ERROR_(?:ILLEGAL_ADDRESS|ASSERT|MISALIGNED_ADDRESS|ILLEGAL_INSTRUCTION)\b"),
        examples=("RuntimeError: CUDA error: an illegal memory access was encountered",),
    ),
    Rule(
        sig(
            "gpu-hardware",
            "The GPU or driver reported a hardware fault (Xid, ECC, fallen off the bus).",
            "Check `dmesg | grep -i xid` and `nvidia-smi -q -d ECC` on the Proxmox host; drain that GPU "
            "(leave it out of gpus_target/gpus_drafters) and reset it or the node before reuse.",
        ),
        lines=(r"NVRM: Xid", r"\bXid \(PCI:", r"(?i:uncorrectable) ECC (?i:error)",
               r"GPU has fallen off the bus", r"NVRM:.{0,200}fallen off the bus",
               r"GPU is lost", r"cudaErrorECCUncorrectable", r"uncorrectable ECC error encountered",
               r"Unable to determine the device handle for GPU"),
        sticky=True,
        examples=("NVRM: Xid (PCI:0000:41:00): 79, pid=91451, GPU has fallen off the bus.",),
    ),
    RECOMPILE_LIMIT,
    Rule(
        sig(
            "nan-loss",
            "The loss became NaN or infinite.",
            "Lower the learning rate or add warm-up, check for fp16 overflow (use bf16), clip gradients, and "
            "look for empty/invalid batches; resume from the last checkpoint before the NaN.",
        ),
        # a message saying so: `Loss is NaN`, detectron2's `Loss became infinite or NaN at iteration=…`, an exception's
        # `Loss is nan, stopping training` (lower-case only after `Error`: a lower-case anchor costs every scan ~15 %)
        lines=(r"(?i:\bloss (?:is|became|went|has become)) (?:infinite or )?(?:NaN|NAN)",
               r"Error: .{0,120}?\b[Ll]oss is nan(?![\w-])"),
        progress_loss=True,
        examples=("step=1201 loss=nan tok/s=1833.0 lr=3.00e-04 acc=0.000", "Loss is NaN at step 1201, stopping",
                  "{'loss': 1.2031, 'grad_norm': nan, 'learning_rate': 1.9e-05, 'epoch': 0.12}"),
    ),
    Rule(
        sig(
            "disk-full",
            "A write failed: no space left on the device (or quota exceeded).",
            "Free space in the workspace (old runs' checkpoints, rotated logs, ~/.cache/torch/inductor); "
            "`df -h <workspace>` inside the container; keep fewer checkpoints.",
        ),
        lines=(r"No space left on device", r"\bENOSPC\b", r"Disk quota exceeded"),
        examples=("OSError: [Errno 28] No space left on device",),
    ),
    Rule(
        sig(
            "import-error",
            "A Python module could not be imported (missing package or broken install).",
            "Install the missing package into the container's Python (the one in hosts.toml `python`), or "
            "redeploy with `dflashctl deploy`; check that the trainer's extras (torch) match.",
        ),
        # transformers' lazy-import wrapper re-raises the ImportError as `RuntimeError: Failed to import
        # transformers.models.x because of the following error (look up to see its traceback):` (issue 28)
        lines=(r"^(?:ModuleNotFoundError|ImportError): ",
               r"Error: Failed to import [\w.]+ because of the following error"),
        exc_types=("ModuleNotFoundError", "ImportError"),
        examples=("ModuleNotFoundError: No module named 'flash_attn'",),
    ),
    Rule(
        sig(
            "cuda-graph-capture",
            "A CUDA graph capture failed (a forbidden call during capture, or a capture from another thread).",
            "Capture per thread with `capture_error_mode=\"thread_local\"` (the trainer's default), warm up "
            "before capture, and keep synchronising calls (.item(), prints of tensors) out of captured code.",
        ),
        lines=(r"CUDA error: operation not permitted when stream is capturing", r"cudaErrorStreamCapture\w+",
               r"CUDA [Gg]raph capture (?i:failed|error)", r"CUDA error: operation failed due to a previous error "
               r"during capture", r"operation not permitted when stream is capturing",
               r"CUDA error: operation would make the legacy stream depend on a capturing blocking stream",
               r"(?:during|while) CUDA graph capture",
               r"CUDA graphs? (?:capture|replay).{0,40}(?:not permitted|unsupported)",
               r"Cannot (?:call|prepare for replay) \w+ (?:during|while) CUDA graph",
               r"CUDAGraph::capture_(?:begin|end)",
               r"cudaStreamCaptureStatus\w+", r"CUDA error: capturing stream has unjoined work",
               r"CUDA error: operation not permitted on an event last recorded in a capturing stream",
               r"Capture cuda graph failed", r"CUDA_ERROR_STREAM_CAPTURE_\w+",
               # after what names CUDA or NCCL on the line (torch's `CUDA error:`, NCCL's `Cuda failure`): a lower-case
               # anchor of their own would cost every scan ~15 %
               r"(?:CUDA|NCCL)\b.{0,120}?(?:" + "|".join(_CAPTURE_ERRORS) + r")"),
        examples=("RuntimeError: CUDA error: operation not permitted when stream is capturing",),
    ),
    TRITON_COMPILE,
    Rule(
        sig(
            "dataloader-worker",
            "A DataLoader worker process died.",
            "Usually host memory (see host-oom) or a crash in the dataset code; run with `num_workers=0` to "
            "see the real traceback, raise the container's /dev/shm size.",
        ),
        lines=(r"DataLoader (?:worker|process) \(pid\(?s?\)? ?[\d, ]*\)? ?(?:exited unexpectedly|(?:exited )?is killed "
               r"by signal)",
               r"DataLoader worker exited unexpectedly",
               r"Caught \w+ in DataLoader worker process \d+",  # the worker's own exception, re-raised in the main
               r"ERROR: Unexpected (?:bus error|segmentation fault|floating-point exception) encountered in worker"),
        examples=("RuntimeError: DataLoader worker (pid(s) 4121) exited unexpectedly",
                  "KeyError: Caught KeyError in DataLoader worker process 0.",
                  "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared "
                  "memory (shm)."),
    ),
    Rule(
        sig(
            "distributed-init",
            "The process group could not be initialised (rendezvous, store or port).",
            "Check MASTER_ADDR/MASTER_PORT (a port still held by a zombie of the last run: `dflashctl "
            "kill-zombies`), the world size, and that every rank was started.",
        ),
        lines=(r"DistNetworkError", r"DistStoreError", r"Rendezvous\w*Error", r"EADDRINUSE", r"Address already in use",
               r"The server socket has failed to listen on any local network address",
               r"The client socket has (?:timed out|failed to connect)", r"Timed out initializing process group",
               r"retrieving ncclUniqueId from \[\d+\] via c10d key-value store.{0,300}(?i:timed? ?out|"
               r"connection (?:reset|refused|closed))",
               r"Timed out after \d+ seconds waiting for clients"),  # the store's server, as a RuntimeError before 2.2
        exc_types=("DistNetworkError", "DistStoreError", "RendezvousTimeoutError", "RendezvousConnectionError",
                   "RendezvousClosedError"),
        examples=("torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
                  "network address. port: 29500, useIPv6: 0, code: -98, name: EADDRINUSE",),
    ),
    Rule(
        sig(
            "segfault",
            "The process died of a segmentation fault (native crash).",
            "Run with `PYTHONFAULTHANDLER=1` to get the Python stack of every thread; common causes are "
            "mismatched CUDA/driver/library builds and use of a tensor after its CUDA context was lost.",
        ),
        lines=(r"Fatal Python error: Segmentation fault", r"\bSegmentation fault\b(?: \(core dumped\))?",
               r"\bSIGSEGV\b", r"\bSegfault encountered\b"),
        death="segv",
        examples=("Fatal Python error: Segmentation fault",),
    ),
    Rule(
        sig(
            "zero-loss",
            "The training loss is stuck at exactly 0.0: nothing is being learned.",
            "Almost always the labels, not the model: every target masked (-100) by the chat template or a "
            "too-short max length, fp16 overflow turning the loss to 0, or a loss scaled away; print one batch's "
            "labels, try bf16, and check the data collator's masking.",
        ),
        progress_zero=True,
        examples=(),
    ),
    INDUCTOR_CACHE_CORRUPT,
    NATIVE_COMPILE,
)

# Literal substrings; a line without any of them (and outside a traceback) cannot match a line pattern.
ANCHORS: tuple[str, ...] = (
    "Error", "CUDA", "CUBLAS", "NCCL", "Watchdog", "Xid", "ECC", "GPU has fallen", "GPU is lost", "_limit",
    "Detected that", "_is_fx", "NaN", "NAN", "No space left", "ENOSPC", "Disk quota", "DefaultCPUAllocator",
    "Out of memory", "Cannot allocate", "OutOfResources", "DataLoader worker", "The server socket",
    "Timed out initializing", "Segmentation fault", "SIGSEGV", "Fatal Python", "Killed", "CONSTRAINT_", "NVRM",
    "SIGKILL", "Assertion", "Device-side assert", "Rendezvous", "EADDRINUSE",
    "The client socket", "Segfault", "HIP out of memory", "THCudaCheck", "Address already in use",
    "Unable to determine the device",
    "Caught", "Tried to allocate", "If reserved", "Timed out waiting", "Heartbeat monitor", "Barrier", "UniqueId",
    "StreamCapture", "Capture cuda graph", "when stream is capturing", "PassManager", "DataLoader",
    "Unexpected ", "too short", "ELF", "CppCompile",
    "collect2", "torchinductor_", "compile cache: ", "InvalidCxx", "C compiler", "Python.h", "ld returned",
    "STREAM_CAPTURE", "HIP error", "Out Of Memory", "StepId", "Work ran for", "Timed out after",
    *(w for w in BASH_KILLED if "Killed" not in w),
)

BY_ID: dict[str, Rule] = {r.signature.id: r for r in RULES}
LOSS_RULES: tuple[Rule, ...] = tuple(r for r in RULES if r.progress_loss)
ZERO_LOSS_RULES: tuple[Rule, ...] = tuple(r for r in RULES if r.progress_zero)

# Each pattern runs only on lines holding one of its anchors: plain substring tests first (fast), the
# regex after (a big alternation of 40 patterns costs ~100 µs a line in Python's engine; this, a few µs).
_PATTERNS: list[tuple[Rule, tuple[str, ...], str]] = [
    (r, tuple(a for a in ANCHORS if a in pat), pat) for r in RULES for pat in r.lines
]
# each pattern compiled the first time a line holding one of its anchors reaches it: compiling all ~125 cost a
# one-shot `status` (a new process every time) ~10 % of its import time, and a healthy log's few special lines
# reach a handful of them
_COMPILED: list[re.Pattern[str] | None] = [None] * len(_PATTERNS)
# anchor → the patterns (indices into _PATTERNS) that contain it: a line is tested only against the patterns of
# the anchors it holds (one substring test per anchor, not one per pattern and anchor)
_BY_ANCHOR: dict[str, tuple[int, ...]] = {
    a: tuple(i for i, (_, anchors, _) in enumerate(_PATTERNS) if a in anchors) for a in ANCHORS
}


# the anchors by their first character: a line is tested for the anchors whose first character it holds (one memchr
# each), not for all ~80 (the per-line cost of a special line, which a healthy log's look-alikes pay: issue 28)
_BY_FIRST: tuple[tuple[str, tuple[tuple[str, tuple[int, ...]], ...]], ...] = tuple(
    (c, tuple((a, idx) for a, idx in _BY_ANCHOR.items() if a[0] == c)) for c in sorted({a[0] for a in _BY_ANCHOR})
)


def match_line(text: str) -> list[Rule]:
    """Every rule whose line pattern occurs in text (a log line with ANSI codes stripped), in table order, less
    those another match supersedes (a corrupt cache's `ImportError: …so: file too short` is not import-error)."""
    candidates = {i for c, group in _BY_FIRST if c in text for a, idx in group if a in text for i in idx}
    found: list[Rule] = []
    for i in sorted(candidates):
        rule = _PATTERNS[i][0]
        if rule not in found and (_COMPILED[i] or _compiled(i)).search(text):
            found.append(rule)
    return drop_superseded(found) if len(found) > 1 else found


def _compiled(i: int) -> re.Pattern[str]:
    pat = _COMPILED[i] = re.compile(_PATTERNS[i][2])
    return pat


def drop_superseded(rules: list[Rule]) -> list[Rule]:
    """rules less the ones a rule among them supersedes (one piece of evidence, its better explanation)."""
    gone = {i for r in rules for i in r.supersedes}
    return [r for r in rules if r.signature.id not in gone] if gone else rules


def match_exception(exc_type: str | None, frames: list[str] | None = None) -> list[Rule]:
    """Rules that recognise a traceback by its final exception type (`torch.OutOfMemoryError`); a rule with
    exc_frames only when the traceback went through one of those paths (an EOFError loading the compile cache)."""
    if not exc_type:
        return []
    short = exc_type.rsplit(".", 1)[-1]
    return [r for r in RULES if short in r.exc_types
            and (not r.exc_frames or any(f in p for p in frames or () for f in r.exc_frames))]


def cache_artifact(text: str) -> str | None:
    """The last compile-cache file a text (a traceback) names: the artefact to remove."""
    found = CACHE_PATH_RE.findall(text)
    return found[-1] if found else None


def match_death(kind: str | None) -> list[Rule]:
    """Rules that recognise a worker's death by how it ended ("kill": signal 9, "segv": signal 11)."""
    return [r for r in RULES if kind is not None and r.death == kind]


def match_frames(paths: list[str]) -> list[Rule]:
    """Rules recognised by where a crashed worker thread's traceback went through (torch/_dynamo …)."""
    return [r for r in RULES if r.frames and any(f in p for p in paths for f in r.frames)]
