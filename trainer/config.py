"""One typed config for the trainer: TOML file + `--set section.key=value` overrides, validated up front.

Every field has a default; the TOML file only names what differs. Unknown sections/keys and bad values raise
`ConfigError`, which `__main__` prints as one line naming the file and the key (exit 2) — a typo must never turn
into a silently ignored setting or a traceback minutes into a run.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

COMPILE_STRATEGIES = ("warmup", "naive", "off")
ATTENTION_PATHS = ("auto", "sdpa", "flex")
FAILURE_POLICIES = ("abort", "continue")
SCHEDULES = ("cosine", "constant")
DIST_BACKENDS = ("auto", "gloo", "nccl")
LAYOUTS = ("threads", "processes")
REDUCE_DTYPES = ("bf16", "fp32")
TARGET_DTYPES = ("auto", "bfloat16", "float32")
PUBLISHED_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}
"""DFlash's loss decay per block size, as published (issue 13); other sizes fall back to 7 * B / 16."""
QWEN3_MASK_TOKEN_ID = 151669
"""The first embedding row past Qwen3's tokenizer (its last added token is 151668): SpecForge's Qwen3 DFlash
configs use it as MASK."""


class ConfigError(Exception):
    """A bad config file, key or value; the message already names file and key."""


@dataclass
class TargetConfig:
    """The frozen target LM: a local HF checkpoint at `path` (its config.json fixes the dimensions below), or
    `path = ""` for the tiny random model built from these fields."""

    path: str = ""
    vocab_size: int = 256
    hidden_size: int = 64
    num_layers: int = 6
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    head_dim: int = 0
    """0 = hidden_size // num_heads (an HF checkpoint's config.json sets it: Qwen3's is 128 whatever the width)."""
    model_type: str = ""
    """From an HF checkpoint's config.json (qwen3, llama, ...); empty for the tiny random target."""
    layer_ids: list[int] = field(default_factory=list)
    """Layers whose outputs are captured; empty = spread over [1, L-3] (DFlash)."""
    num_captured: int = 3
    """How many layers to capture when `layer_ids` is empty."""
    init_seed: int = 1234
    micro_batches: int = 1
    """HF targets split over several devices: the batch goes through the layer stages in this many micro-batches,
    so on CUDA stage k works on micro-batch i while stage k+1 works on i-1 (trainer/hf.py hidden_states)."""
    dtype: str = "auto"
    """Target weights and hidden states: auto = bfloat16 for an HF checkpoint on CUDA, else float32. The drafter
    keeps fp32 parameters and runs under autocast in the target's dtype (trainer/model.py, Drafter)."""


@dataclass
class DrafterConfig:
    """The DFlash drafter: a few layers over [projected target context ; block]."""

    num_layers: int = 2
    block_size: int = 16
    init_std: float = 0.02
    """Linear weights ~ normal(0, init_std), biases 0 (SpecForge's initializer_range); 0 = torch's default Linear
    init (uniform +-1/sqrt(fan_in)), what the tiny CPU demo keeps: at hidden 64 it learns visibly in 60 steps."""
    gamma: float = 0.0
    """Loss decay exp(-(k-1)/gamma); 0 = DFlash's published value for the block size (`PUBLISHED_GAMMA`: 7 for
    16, 5 for 10, 4 for 8), 7 * B / 16 for other sizes."""
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    attention_bias: bool = False
    """Biases on q/k/v/o (Qwen3: none; the reference reads `attention_bias` from its config)."""
    head_dim: int = 0
    """0 = the target's head dim (the reference drafter reads `head_dim` from its config, as Qwen3 does)."""
    mask_token_id: int = -1
    """The MASK token filling a block after its anchor; recorded in checkpoints and exports. -1 = auto: 151669 for
    a Qwen3-family target with a vocabulary past it (SpecForge's Qwen3 DFlash configs), else the target's last
    embedding row (unused on checkpoints whose embedding is padded past the tokenizer, as on ours)."""
    init_from: str = ""
    """A drafter directory in the reference layout (config.json + model.safetensors: `python -m trainer.export`'s
    output, or a published DFlash drafter) to start from instead of the random initialisation."""


@dataclass
class DataConfig:
    """Synthetic sequences (see docs/trainer.md): uniform prompt, then a fixed sparse Markov chain response."""

    kind: str = "markov"
    """markov = synthetic chain (below); generated = a directory from `python -m trainer.data generate`."""
    dir: str = ""
    """The generated data directory (kind = "generated")."""
    prompt_len: int = 16
    branching: int = 2
    """Successors per token in the chain; the first has probability `top_prob`."""
    top_prob: float = 0.9
    chain_seed: int = 7


@dataclass
class DevicesConfig:
    target: list[str] = field(default_factory=lambda: ["cpu"])
    drafters: list[str] = field(default_factory=lambda: ["cpu", "cpu", "cpu"])


@dataclass
class TrainConfig:
    steps: int = 100
    """Training steps: the run's length and the schedule's horizon. 0 = `epochs` passes over the data set."""
    epochs: int = 0
    """Passes over a generated data set (steps per epoch = samples // (drafters * batch_size)); the run stops after
    them or at `steps` (when > 0), whichever comes first, and the schedule spans the run. 0 = no epoch limit."""
    batch_size: int = 4
    """Sequences per drafter per step."""
    seq_len: int = 128
    num_anchors: int = 4
    """Anchors (blocks) per sequence; fixed so every shape is static."""
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 10
    warmup_ratio: float = 0.0
    """> 0: warm-up = int(warmup_ratio * steps) steps (SpecForge's rule), instead of `warmup_steps`."""
    schedule: str = "cosine"
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    """AdamW (beta1, beta2)."""
    loss_chunk: int = 2048
    """Rows (block positions) of LM-head logits per chunk of the loss, forward and backward; 0 = the full logits
    at once. 2048 rows = 128 blocks of 16, SpecForge's `objective_chunk_blocks` default."""
    grad_clip: float = 1.0
    seed: int = 0
    log_interval: int = 10
    checkpoint_interval: int = 50
    keep_checkpoints: int = 3
    queue_depth: int = 2


@dataclass
class EvalConfig:
    """Periodic acceptance-length evaluation (real speculative decoding) from the logging drafter thread."""

    interval: int = 0
    """Steps between evaluations (and at the last step); 0 = off."""
    prompts: str = ""
    """Prompt JSONL (prompt / messages / ids) or a generated data directory."""
    num_prompts: int = 4
    max_new_tokens: int = 32


@dataclass
class RuntimeConfig:
    compile_strategy: str = "warmup"
    attention: str = "auto"
    """auto = flex_attention on CUDA, SDPA with the materialised mask on CPU (flex has no CPU backward)."""
    on_worker_failure: str = "abort"
    torch_threads: int = 1
    """Intra-op threads per process; 1 avoids N worker threads x M OpenMP threads fighting over few cores."""
    heartbeat_interval_s: float = 2.0
    recompile_limit: int = 8
    cuda_graphs: bool = False
    """CUDA only: compile with mode='reduce-overhead' on each device that one drafter thread uses alone
    (trainer/compile.py compile_mode says why not on a shared one)."""
    cuda_streams: bool = True
    """CUDA only: every worker thread on its own streams (trainer/streams.py); false = the default stream."""
    dist_backend: str = "auto"
    """Several processes (torchrun): auto = NCCL for CUDA drafters, gloo on the CPU (trainer/distributed.py)."""
    dist_timeout_s: float = 60.0
    """Several processes: a collective waiting longer than this for a hung peer fails the run (torch's default is
    30 minutes; a peer that dies is noticed sooner). Must exceed rank 0's pauses between steps (evaluation)."""
    dist_bucket_mb: float = 25.0
    """Several processes: the gradient all-reduce's bucket size in MiB (DDP's default); 0 = one bucket."""
    layout: str = "threads"
    """threads: one process, a coordinator thread runs the target over devices.target and one drafter thread per
    devices.drafters entry (the seed's 5+3); under torchrun each process is such a group. processes: N ranks under
    torchrun, each one GPU holding a target replica and one drafter (devices.target = devices.drafters = one
    device, shifted per local rank), gradients reduced by torch DDP (bucketed, overlapped with the backward)."""
    grad_reduce_dtype: str = "bf16"
    """layout = processes: the dtype gradients travel in (DDP's bf16 compression hook; fp32 = uncompressed)."""
    dist_warmup_timeout_s: float = 1800.0
    """Several processes: how long the barrier after warm-up waits for the slowest rank's cold compile (through
    the group's store, so the collectives' shorter dist_timeout_s never trips on compile skew)."""


@dataclass
class Config:
    target: TargetConfig = field(default_factory=TargetConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    data: DataConfig = field(default_factory=DataConfig)
    devices: DevicesConfig = field(default_factory=DevicesConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    @property
    def gamma(self) -> float:
        """`drafter.gamma`, or DFlash's published value for the block size, or 7 * B / 16 for other sizes."""
        bs = self.drafter.block_size
        return self.drafter.gamma or PUBLISHED_GAMMA.get(bs, 7.0 * bs / 16)

    @property
    def mask_token_id(self) -> int:
        """The drafter's MASK id (drafter.mask_token_id; see there for what auto picks)."""
        if self.drafter.mask_token_id >= 0:
            return self.drafter.mask_token_id
        t = self.target
        if t.model_type == "qwen3" and t.vocab_size > QWEN3_MASK_TOKEN_ID:
            return QWEN3_MASK_TOKEN_ID
        return t.vocab_size - 1

    @property
    def layer_ids(self) -> list[int]:
        return self.target.layer_ids or spread_layers(self.target.num_layers, self.target.num_captured)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def spread_layers(num_layers: int, count: int) -> list[int]:
    """DFlash's choice: `count` layers evenly over [1, L-3] (e.g. 1, 9, 17, 25, 33 of 36)."""
    lo, hi = 1, max(1, num_layers - 3)
    if count <= 1:
        return [lo]
    return sorted({round(lo + i * (hi - lo) / (count - 1)) for i in range(count)})


def _coerce(value: Any, default: Any, where: str) -> Any:
    """Check/convert one value against the default's type (int accepted for float, nothing else widened)."""
    is_num = isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok, value = is_num, float(value) if is_num else value
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise ConfigError(f"{where}: expected {type(default).__name__}, got {type(value).__name__} {value!r}")
    return list(value) if isinstance(value, list) else value


def _parse_override(text: str, default: Any) -> Any:
    """`--set` values are typed by the default: `50` for ints, `true` for bools, TOML syntax for lists."""
    if isinstance(default, str):
        return text
    if isinstance(default, bool):
        low = text.lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        return text
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _apply(cfg: Config, section: str, key: str, value: Any, where: str) -> None:
    sub = getattr(cfg, section, None)
    if sub is None or not dataclasses.is_dataclass(sub):
        raise ConfigError(f"{where}: unknown section [{section}]")
    names = {f.name for f in dataclasses.fields(sub)}
    if key not in names:
        raise ConfigError(f"{where}: unknown key '{section}.{key}'")
    setattr(sub, key, _coerce(value, getattr(sub, key), where))


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Read TOML (if given), apply `section.key=value` overrides, validate. Raises ConfigError."""
    cfg = Config()
    name = str(path) if path else "<defaults>"
    if path:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"{name}: file not found") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{name}: cannot read ({e})") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{name}: invalid TOML ({e})") from None
        for section, body in data.items():
            if not isinstance(body, dict):
                raise ConfigError(f"{name}: key '{section}': expected a [{section}] table")
            for key, value in body.items():
                _apply(cfg, section, key, value, f"{name}: key '{section}.{key}'")
    for item in overrides:
        where = f"{name}: override '{item}'"
        dotted, sep, text = item.partition("=")
        section, dot, key = dotted.strip().partition(".")
        if not sep or not dot:
            raise ConfigError(f"{where}: expected section.key=value")
        sub = getattr(cfg, section, None)
        default = getattr(sub, key, None) if dataclasses.is_dataclass(sub) else None
        _apply(cfg, section, key, _parse_override(text.strip(), default), where)
    validate(cfg, name)
    return cfg


def validate(cfg: Config, name: str) -> None:
    """Cross-field checks; each error names the key it is about."""

    def need(ok: bool, key: str, why: str) -> None:
        if not ok:
            raise ConfigError(f"{name}: key '{key}': {why}")

    t, d, tr, rt, dv, da = cfg.target, cfg.drafter, cfg.train, cfg.runtime, cfg.devices, cfg.data
    need(rt.compile_strategy in COMPILE_STRATEGIES, "runtime.compile_strategy", f"one of {COMPILE_STRATEGIES}")
    need(rt.attention in ATTENTION_PATHS, "runtime.attention", f"one of {ATTENTION_PATHS}")
    need(rt.attention != "flex" or all(d.startswith("cuda") for d in dv.drafters), "runtime.attention",
         "flex needs CUDA drafters (flex_attention has no backward on the CPU); use auto or sdpa")
    need(rt.on_worker_failure in FAILURE_POLICIES, "runtime.on_worker_failure", f"one of {FAILURE_POLICIES}")
    need(tr.schedule in SCHEDULES, "train.schedule", f"one of {SCHEDULES}")
    need(t.dtype in TARGET_DTYPES, "target.dtype", f"one of {TARGET_DTYPES}")
    need(da.kind in ("markov", "generated"), "data.kind", "one of ('markov', 'generated')")
    need(da.kind != "generated" or bool(da.dir), "data.dir", "needed when data.kind = 'generated'")
    need(da.kind != "generated" or bool(t.path), "target.path",
         "needed when data.kind = 'generated' (the data is an HF target's own answers, in its vocabulary)")
    if t.path:  # an HF checkpoint: its config.json, not the TOML, fixes the dimensions (read without torch)
        from trainer.hf_config import HFConfigError, target_dims

        try:
            for key, value in target_dims(t.path).items():
                setattr(t, key, value)
        except HFConfigError as e:
            need(False, "target.path", str(e))
    if d.init_from:  # the drafter directory fixes the drafter's shape, block size, MASK id and target layers
        from trainer.drafter_format import DrafterFormatError, apply_init_from

        try:
            apply_init_from(cfg, d.init_from)
        except DrafterFormatError as e:
            need(False, "drafter.init_from", str(e))
    ev = cfg.eval
    need(ev.interval >= 0, "eval.interval", "must be >= 0 (0 = off)")
    need(ev.num_prompts >= 1, "eval.num_prompts", "must be >= 1")
    need(ev.max_new_tokens >= 1, "eval.max_new_tokens", "must be >= 1")
    need(not ev.interval or bool(ev.prompts), "eval.prompts", "needed when eval.interval > 0")
    for key in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size"):
        need(getattr(t, key) > 0, f"target.{key}", "must be > 0")
    need(t.hidden_size % t.num_heads == 0, "target.num_heads", "must divide target.hidden_size")
    need(t.num_heads % t.num_kv_heads == 0, "target.num_kv_heads", "must divide target.num_heads")
    need((t.hidden_size // t.num_heads) % 2 == 0, "target.num_heads", "head dim must be even (rotary)")
    need(all(isinstance(i, int) and 0 <= i < t.num_layers for i in t.layer_ids), "target.layer_ids",
         f"layer ids must be ints in [0, {t.num_layers})")
    need(t.num_captured >= 1, "target.num_captured", "must be >= 1")
    need(d.num_layers >= 1, "drafter.num_layers", "must be >= 1")
    need(d.init_std >= 0, "drafter.init_std", "must be >= 0 (0 = torch's default Linear init)")
    need(d.block_size >= 2, "drafter.block_size", "must be >= 2")
    need(d.gamma >= 0, "drafter.gamma", "must be >= 0")
    need(bool(d.head_dim) or t.hidden_size % d.num_heads == 0, "drafter.num_heads",
         "must divide target.hidden_size (or set drafter.head_dim)")
    need(d.head_dim >= 0 and d.head_dim % 2 == 0, "drafter.head_dim", "must be even (rotary), 0 = the target's")
    need(-1 <= d.mask_token_id < t.vocab_size, "drafter.mask_token_id",
         f"must be a token id below the target's vocab_size {t.vocab_size}, or -1 (auto)")
    need(d.num_heads % d.num_kv_heads == 0, "drafter.num_kv_heads", "must divide drafter.num_heads")
    need(d.intermediate_size > 0, "drafter.intermediate_size", "must be > 0")
    need(tr.steps >= 0 and tr.epochs >= 0, "train.steps" if tr.steps < 0 else "train.epochs", "must be >= 0")
    need(tr.steps >= 1 or tr.epochs >= 1, "train.steps", "must be >= 1 (or 0 with train.epochs >= 1)")
    need(not tr.epochs or da.kind == "generated", "train.epochs",
         "needs data.kind = 'generated' (the Markov data has no end)")
    need(0 <= tr.warmup_ratio < 1, "train.warmup_ratio", "must be in [0, 1)")
    need(len(tr.betas) == 2 and all(isinstance(b, int | float) and 0 <= b < 1 for b in tr.betas), "train.betas",
         "must be [beta1, beta2], each in [0, 1)")
    need(tr.loss_chunk >= 0, "train.loss_chunk", "must be >= 0 (0 = unchunked)")
    for key in ("target.micro_batches", "train.batch_size", "train.num_anchors", "train.log_interval",
                "train.keep_checkpoints", "train.queue_depth"):
        need(getattr(getattr(cfg, key.partition(".")[0]), key.partition(".")[2]) >= 1, key, "must be >= 1")
    room = tr.seq_len - da.prompt_len - 1  # Markov anchors: any response position with a next token
    need(da.kind != "markov" or room >= tr.num_anchors, "train.seq_len",
         f"response part too short: seq_len - prompt_len - 1 = {room} < num_anchors {tr.num_anchors}")
    need(da.prompt_len >= 1, "data.prompt_len", "must be >= 1")
    need(1 <= da.branching <= t.vocab_size - 1, "data.branching", "must be in [1, vocab_size-1]")
    need(0 < da.top_prob <= 1, "data.top_prob", "must be in (0, 1]")
    need(tr.lr > 0 and 0 <= tr.min_lr <= tr.lr, "train.min_lr", "need 0 <= min_lr <= lr and lr > 0")
    need(tr.warmup_steps >= 0, "train.warmup_steps", "must be >= 0")
    need(tr.checkpoint_interval >= 0, "train.checkpoint_interval", "must be >= 0 (0 = only at exit)")
    need(len(dv.drafters) >= 1, "devices.drafters", "need at least one drafter device")
    need(len(dv.target) >= 1, "devices.target", "need at least one target device")
    for key, devs in (("devices.target", dv.target), ("devices.drafters", dv.drafters)):
        for dev in devs:
            need(isinstance(dev, str) and (dev == "cpu" or _is_cuda(dev)), key, f"bad device {dev!r}")
    need(rt.torch_threads >= 0, "runtime.torch_threads", "must be >= 0 (0 = leave torch's default)")
    need(rt.heartbeat_interval_s > 0, "runtime.heartbeat_interval_s", "must be > 0")
    need(rt.dist_backend in DIST_BACKENDS, "runtime.dist_backend", f"one of {DIST_BACKENDS}")
    need(rt.dist_timeout_s > 0, "runtime.dist_timeout_s", "must be > 0")
    need(rt.layout in LAYOUTS, "runtime.layout", f"one of {LAYOUTS}")
    need(rt.grad_reduce_dtype in REDUCE_DTYPES, "runtime.grad_reduce_dtype", f"one of {REDUCE_DTYPES}")
    need(rt.dist_warmup_timeout_s > 0, "runtime.dist_warmup_timeout_s", "must be > 0")
    need(rt.layout != "processes" or (len(dv.drafters) == 1 and list(dv.target) == list(dv.drafters)),
         "runtime.layout", "'processes' holds the target and one drafter on one device per rank: set "
         "devices.target and devices.drafters to the same single device (e.g. [\"cuda:0\"]; each torchrun rank "
         "shifts it to its own GPU)")
    need(rt.layout != "processes" or rt.on_worker_failure == "abort", "runtime.on_worker_failure",
         "'continue' is for the threads layout; use 'abort' with layout = 'processes'")
    need(rt.dist_bucket_mb >= 0, "runtime.dist_bucket_mb", "must be >= 0 (0 = one bucket)")
    need(rt.recompile_limit >= 1, "runtime.recompile_limit", "must be >= 1")


def _is_cuda(dev: str) -> bool:
    head, _, idx = dev.partition(":")
    return head == "cuda" and (idx == "" or idx.isdigit())


def config_from_dict(data: dict[str, Any]) -> Config:
    """Rebuild a Config saved in a checkpoint (`Config.to_dict()`; unknown keys from other versions ignored)."""
    cfg = Config()
    for section, body in data.items():
        sub = getattr(cfg, section, None)
        if not dataclasses.is_dataclass(sub) or not isinstance(body, dict):
            continue
        names = {f.name for f in dataclasses.fields(sub)}
        for key, value in body.items():
            if key in names:
                setattr(sub, key, value)
    return cfg
