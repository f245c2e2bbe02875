"""The torch.compile family of signatures: threads racing dynamo, recompiles, Triton and native builds that fail, a
compile cache a kill left half-written (issue 24, 28). signatures.py puts them in the table, in DESIGN's order."""

from __future__ import annotations

import re

from dflashctl.analysis.sigrule import Rule, sig

# a file path inside a compile cache: inductor's (`/tmp/torchinductor_root/…`, a TORCHINDUCTOR_CACHE_DIR named
# `…inductor…`, as dflashctl's `<workspace>/cache/inductor`) or Triton's (`~/.triton/cache/…`, dflashctl's
# `<workspace>/cache/triton/…`)
_CACHE_PATH = r"(?:/[^\s'\":]*(?:torchinductor_|inductor|/\.triton/cache/|triton/cache/|cache/triton/)[^\s'\":]*)"
CACHE_PATH_RE = re.compile(_CACHE_PATH + r"\.(?:so|o|py|cubin|ptx|json|pkl|bin|hsaco)\b")

COMPILE_THREAD_RACE = Rule(
    sig(
        "compile-thread-race",
        "torch.compile raced between threads: dynamo/FX tracing state is process-global and not thread safe.",
        'Set `compile_strategy = "warmup"` under `[runtime]` in the trainer config (the default; or '
        "`dflashctl launch -- --set runtime.compile_strategy=warmup`). It compiles and warms every "
        "compiled function on one thread per device before the drafter threads start, uses fixed shapes, "
        "applies dynamo/inductor settings inside each thread, never calls eager flex_attention while workers "
        "run compiled code, and counts recompiles after warm-up. `naive` (compile on first call in each "
        "thread) reproduces this crash; locks around the first call do not fix it.",
    ),
    lines=(
        r"Detected that you are using FX to symbolically trace a dynamo-optimized function",
        r"_is_fx_tracing_flag",
        # a dynamo/inductor failure inside a DataParallel replica (replicas run in threads)
        r"Caught (?:TorchRuntimeError|InternalTorchDynamoError|BackendCompilerFailed|InductorError|Unsupported|"
        r"TorchDynamoException|ObservedException|UncapturedHigherOrderOpError) in replica \d+ on device \d+",
    ),
    frames=("torch/_dynamo/", "torch/_inductor/", "torch/fx/"),
    examples=(
        "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function. "
        "This is not supported at the moment.",
        "torch._dynamo.exc.TorchRuntimeError: Caught TorchRuntimeError in replica 0 on device 0.",
    ),
)

RECOMPILE_LIMIT = Rule(
    sig(
        "recompile-limit",
        "torch.compile hit its recompile limit and fell back to eager for that function (slow).",
        "Something changes shape or a guarded value every step: fix shapes (pad to fixed lengths), mark "
        "dynamic dims explicitly, and look at `TORCH_LOGS=recompiles`; the trainer reports recompiles "
        "after warm-up in its heartbeat.",
    ),
    lines=(r"hit config\.(?:recompile_limit|cache_size_limit|accumulated_recompile_limit)",
           r"cache_size_limit reached"),
    exc_types=("RecompileLimitExceeded", "FailOnRecompileLimitHit"),
    sticky=True,
    examples=("W1129 09:51:13.201000 91451 torch/_dynamo/convert_frame.py:964] torch._dynamo hit "
              "config.recompile_limit (8)",),
)

TRITON_COMPILE = Rule(
    sig(
        "triton-compile",
        "Inductor could not compile a Triton kernel.",
        "Check the Triton/torch versions match; clear the inductor cache (`rm -rf /tmp/torchinductor_$USER`); "
        "`TORCHINDUCTOR_MAX_AUTOTUNE=0`; as a stopgap compile that function with backend=\"aot_eager\".",
    ),
    lines=(r"triton\.compiler\.errors\.\w*Error", r"\bPTXASError\b", r"OutOfResources: out of resource",
           r"InductorError: (?:[\w.]+\.)?(?:CompilationError|PTXASError|OutOfResources|MLIRCompilationError)",
           r"PassManager::run failed", r"triton\.runtime\.errors\.\w+Error",
           # Triton's own message (`at LINE:COL:`) on a line of its own, as `BackendCompilerFailed … raised:` leaves it
           r"^(?:[\w.]+\.)?CompilationError: at \d+:\d+:"),
    exc_types=("CompilationError", "PTXASError", "OutOfResources", "MLIRCompilationError"),
    examples=("triton.compiler.errors.CompilationError: at 12:4: error: unsupported type",),
)

INDUCTOR_CACHE_CORRUPT = Rule(
    sig(
        "inductor-cache-corrupt",
        "A compiled artefact in the inductor/Triton cache is truncated or corrupt (a run killed while "
        "torch.compile wrote it): every later compile that loads it fails the same way.",
        "Remove the artefact the evidence line names (only that file, inside the cache), or the whole cache "
        "directory, and run again: `TORCHINDUCTOR_CACHE_DIR` if set, else `/tmp/torchinductor_$USER` (Triton's "
        "`TRITON_CACHE_DIR`, else `~/.triton/cache`). Runs dflashctl launches keep theirs in the workspace "
        "(`<workspace>/cache/inductor`, `<workspace>/cache/triton`), and `dflashctl stop`/`kill-zombies` remove "
        "what a process they killed left half-written. This is not a missing package: do not reinstall "
        "anything.",
    ),
    lines=(
        _CACHE_PATH + r"\.(?:so|o|cubin|ptx|hsaco)\b[^:\n]*: (?:file too short|invalid ELF header|"
        r"ELF load command|unexpected end of file|file format not recognized|error reading|"
        r"cannot read file data|ELF file's phentsize|undefined symbol: \w+)",
        r"(?:Error|error)\b.{0,80}" + _CACHE_PATH + r"\.(?:so|o)\b.{0,40}(?:truncated|too short|file too short)",
        # the bundled trainer's own lines (trainer/compile_cache.py): a recovery (history once training goes on) and
        # a second failure after it (reported as such)
        r"^compile cache: corrupt artefact \S+", r"^compile cache: the compile failed again after removing",
    ),
    exc_types=("EOFError", "UnpicklingError", "SyntaxError", "JSONDecodeError", "BadZipFile"),
    exc_frames=("torchinductor_", "torch/_inductor/codecache.py", "torch/_inductor/fx_graph", "/.triton/cache/",
                "triton/runtime/cache.py", "torch/_inductor/runtime/cache", "torch/_functorch/_aot_autograd/"
                "autograd_cache.py"),
    supersedes=("import-error", "native-compile", "triton-compile"),
    examples=("torch._inductor.exc.InductorError: ImportError: /tmp/torchinductor_root/x4/cx4vm7.so: file "
              "too short",
              "ImportError: /tmp/torchinductor_ci/2b/c2bwkmm3.so: invalid ELF header"),
)

NATIVE_COMPILE = Rule(
    sig(
        "native-compile",
        "torch.compile could not build native code: the C/C++ compiler or the linker failed (inductor's C++ "
        "kernels or wrapper, or Triton's launcher stub).",
        "Read the compiler's own error lines above the exception. A missing compiler, header (`Python.h`) or "
        "library (`-lcuda`) is the container's: `apt-get install build-essential python3-dev`, point `CXX`/`CC` "
        "at a working compiler, make the driver's libcuda.so visible. An error inside the generated kernel "
        "(`/tmp/torchinductor_…/….cpp`) is an inductor bug: compile that function with backend=\"aot_eager\" "
        "or exclude it from torch.compile, and report it upstream with the command shown.",
    ),
    lines=(r"CppCompileError", r"collect2: error: ld returned \d+ exit status",
           r"InvalidCxxCompiler", r"No working C compiler found",
           r"Failed to find C compiler",
           # the compiler by its name at the end of its path, any platform: gcc/g++/clang, MinGW's gcc.exe, MSVC's
           # cl.exe and the tcc Triton bundles on Windows (issue 28), Intel's icx; building a module (-shared, /LD)
           r"CalledProcessError: Command '\['[^']*?(?i:gcc|g\+\+|c\+\+|clang(?:\+\+|-cl)?|\bcc|\bcl|\btcc|\bicx|\bicpx)"
           r"(?:-\d+)?(?i:\.exe)?', (?=.{0,2000}(?:torchinductor_|main\.c|\.cpp'|-shared|/LD|\.c',))",
           r"InductorError: (?:[\w.]+\.)?(?:CalledProcessError|CppCompileError|InvalidCxxCompiler)",
           r"fatal error: Python.h: No such file or directory", r"error: ld returned \d+ exit status"),
    exc_types=("CppCompileError", "InvalidCxxCompiler"),
    examples=("torch._inductor.exc.InductorError: CppCompileError: C++ compile error",
              "collect2: error: ld returned 1 exit status",
              "subprocess.CalledProcessError: Command '['/usr/bin/gcc', '/tmp/tmpy1gk3r1e/main.c', '-O3', "
              "'-shared', '-fPIC', '-o', '/tmp/tmpy1gk3r1e/cuda_utils.cpython-310-x86_64-linux-gnu.so', '-lcuda']' "
              "returned non-zero exit status 1."),
)
