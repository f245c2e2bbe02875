"""Issue 28's forms, each by the rule that recognises it (not by a corpus file): a corrupt compile-cache artefact is
not a missing package, a thread's traceback is a thread's even without its header, a worker killed by signal 9 is
the host's memory, and the look-alikes that must stay unlabelled. The lines are real wordings (the corpus cases
`i28-*` in tests/analysis/data/real/ hold them in context, with their sources)."""

from __future__ import annotations

from dflashctl.analysis.health import active_hits
from dflashctl.analysis.logscan import scan


def _ids(log: str) -> list[str]:
    return [h.signature.id for h in active_hits(scan(log.encode()))]


def _evidence(log: str, sig: str) -> str:
    return next(h.text for h in active_hits(scan(log.encode())) if h.signature.id == sig)


CACHE_TB = """\
Traceback (most recent call last):
  File "/opt/venv/lib/python3.11/site-packages/torch/_inductor/codecache.py", line 2035, in load_by_key_path
    mod = _reload_python_module(key, path)
torch._inductor.exc.InductorError: ImportError: /tmp/torchinductor_root/x4/cx4vm7abc.main.so: file too short
"""


def test_a_truncated_cache_so_is_inductor_cache_corrupt_not_import_error_and_names_the_file() -> None:
    assert _ids(CACHE_TB) == ["inductor-cache-corrupt"]
    assert "/tmp/torchinductor_root/x4/cx4vm7abc.main.so" in _evidence(CACHE_TB, "inductor-cache-corrupt")


def test_a_bare_import_error_line_on_a_cache_launcher_is_the_cache_too() -> None:
    line = ("ImportError: /tmp/torchinductor_u/triton/0/d5f8c1a4/__triton_launcher.so: undefined symbol: "
            "cuLaunchKernel\n")
    assert _ids(line) == ["inductor-cache-corrupt"]


def test_a_corrupt_artefact_in_dflashctls_workspace_caches_is_the_cache_too() -> None:
    for path in ("/ws/cache/inductor/ab/cabc.so",
                 "/ws/cache/triton/XU5DT2AO/cuda_utils.cpython-311-x86_64-linux-gnu.so"):
        assert _ids(f"torch._inductor.exc.InductorError: ImportError: {path}: file too short\n") == [
            "inductor-cache-corrupt"], path


def test_the_same_error_on_a_library_outside_any_cache_stays_import_error() -> None:
    log = ("Traceback (most recent call last):\n  File \"train.py\", line 1, in <module>\n    import torch\n"
           "ImportError: /home/u/envs/lib/python3.9/site-packages/torch/lib/libtorch_cpu.so: invalid ELF header\n")
    assert _ids(log) == ["import-error"]


def test_an_eof_error_loading_the_fx_graph_cache_is_the_cache_and_its_evidence_names_the_entry() -> None:
    log = """\
Traceback (most recent call last):
  File "/usr/lib/python3/dist-packages/torch/_inductor/codecache.py", line 1203, in _lookup_graph
    graph = pickle.load(f)
  File "/tmp/torchinductor_root/fxgraph/ab/fabc123/0.pkl", line 1, in <module>
EOFError: Ran out of input
"""
    assert _ids(log) == ["inductor-cache-corrupt"]
    assert "/tmp/torchinductor_root/fxgraph/ab/fabc123/0.pkl" in _evidence(log, "inductor-cache-corrupt")


def test_an_eof_error_elsewhere_is_not_the_cache() -> None:
    log = ("Traceback (most recent call last):\n  File \"data.py\", line 7, in load\n    x = pickle.load(f)\n"
           "EOFError: Ran out of input\n")
    assert _ids(log) == []


def test_a_thread_traceback_through_dynamo_without_its_header_is_the_compile_race() -> None:
    log = """\
Traceback (most recent call last):
  File "/usr/lib/python3.11/threading.py", line 1045, in _bootstrap_inner
    self.run()
  File "/usr/lib/python3.11/threading.py", line 982, in run
    self._target(*self._args, **self._kwargs)
  File "/work/drafter.py", line 40, in worker
    out = step(batch)
  File "/usr/lib/python3/dist-packages/torch/_dynamo/eval_frame.py", line 451, in _fn
    return fn(*args, **kwargs)
torch._dynamo.exc.InternalTorchDynamoError: 'NoneType' object has no attribute 'f_locals'
"""
    assert _ids(log) == ["compile-thread-race"]


def test_the_same_traceback_in_the_main_thread_is_not_a_race() -> None:
    log = """\
Traceback (most recent call last):
  File "/work/train.py", line 40, in main
    out = step(batch)
  File "/usr/lib/python3/dist-packages/torch/_dynamo/eval_frame.py", line 451, in _fn
    return fn(*args, **kwargs)
torch._dynamo.exc.InternalTorchDynamoError: 'NoneType' object has no attribute 'f_locals'
"""
    assert _ids(log) == []


def test_a_dynamo_error_caught_in_a_dataparallel_replica_is_the_compile_race() -> None:
    log = """\
Traceback (most recent call last):
  File "/usr/lib/python3/dist-packages/torch/nn/parallel/data_parallel.py", line 171, in forward
    outputs = self.parallel_apply(replicas, inputs, kwargs)
RuntimeError: Caught RuntimeError in replica 1 on device 1.
Original Traceback (most recent call last):
  File "/usr/lib/python3/dist-packages/torch/nn/parallel/parallel_apply.py", line 83, in _worker
    output = module(*input, **kwargs)
  File "/usr/lib/python3/dist-packages/torch/_dynamo/eval_frame.py", line 328, in _fn
    return fn(*args, **kwargs)
RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function.
"""
    assert _ids(log) == ["compile-thread-race"]
    plain_replica = log.replace("torch/_dynamo/eval_frame.py", "mymodel/layers.py").replace(
        "Detected that you are using FX to symbolically trace a dynamo-optimized function.", "shape mismatch")
    assert _ids(plain_replica) == []


def test_a_dataloader_worker_killed_by_signal_9_is_also_the_hosts_memory() -> None:
    assert set(_ids("RuntimeError: DataLoader worker (pid 13904) is killed by signal: Killed. \n")) == {
        "dataloader-worker", "host-oom"}
    assert _ids("RuntimeError: DataLoader worker (pid 8102) is killed by signal: Terminated.\n") == [
        "dataloader-worker"]


def test_a_worker_exception_reraised_in_the_main_process_is_dataloader_worker() -> None:
    assert _ids("KeyError: Caught KeyError in DataLoader worker process 3.\n") == ["dataloader-worker"]


def test_gloo_send_and_recv_timeouts_are_collective_timeouts() -> None:
    for op in ("recv", "send"):
        line = (f"RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                f"1800000ms for {op} operation to complete\n")
        assert _ids(line) == ["nccl-timeout"]


def test_a_dist_backend_error_that_timed_out_is_the_timeout_not_an_nccl_fault() -> None:
    log = ("torch.distributed.DistBackendError: [Rank 2] Watchdog caught collective operation timeout: "
           "WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600062 milliseconds before timing out.\n")
    assert _ids(log) == ["nccl-timeout"]


def test_the_ooms_message_tail_alone_is_cuda_oom() -> None:
    assert _ids("Tried to allocate 20.00 MiB (GPU 0; 1.96 GiB total capacity; 1.24 GiB already allocated)\n") == [
        "cuda-oom"]
    assert _ids("Tried to allocate 64.00 MiB. GPU 0 has a total capacty of 8.00 GiB of which 0 bytes is free.\n") == [
        "cuda-oom"]


def test_native_build_failures_are_native_compile() -> None:
    assert _ids("torch._inductor.exc.InductorError: CppCompileError: C++ compile error\n") == ["native-compile"]
    assert _ids("collect2: error: ld returned 1 exit status\n") == ["native-compile"]


def test_look_alikes_stay_clean() -> None:
    healthy = """\
[WARNING] [stage3.py:1850:step] 4 pytorch allocator cache flushes since last step. error_rate=0.00 overflow=False
[INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536
Compiling kernels into /tmp/torchinductor_root/ab (cache hit)
NameError handling: none
step=10 loss=2.1 grad_norm=0.8
"""
    assert _ids(healthy) == []


def test_the_trainers_cache_recovery_is_history_once_training_goes_on_and_a_second_failure_is_reported() -> None:
    from pathlib import Path

    from trainer.compile_cache import CacheFailure, failed_again_line, recovered_line

    root = Path("/ws/cache/inductor")
    art = "/ws/cache/inductor/x4/cx4vm7.main.so"
    recovered = recovered_line(CacheFailure(art, f"ImportError: {art}: file too short"), [Path(art)], root)
    steps = "".join(f"step={i} loss=2.0 tok/s=100.0\n" for i in range(1, 4))
    assert _ids(f"{recovered}\n{steps}") == []  # recovered: training went on
    assert _ids(f"{steps}{recovered}\n") == ["inductor-cache-corrupt"]  # nothing after it yet: it stands
    again = failed_again_line(ImportError(f"{art}: file too short"), root)
    log = f"{recovered}\n{again}\n"
    assert _ids(log) == ["inductor-cache-corrupt"]
    assert str(root) in _evidence(log, "inductor-cache-corrupt")
    bare = failed_again_line(RuntimeError("Triton Error [CUDA]: device kernel image is invalid"), root)
    assert _ids(f"{recovered}\n{steps}{bare}\n") == ["inductor-cache-corrupt"]  # the trainer's own words suffice
