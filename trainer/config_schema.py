"""The trainer's typed config: its sections, every field's default and meaning, and what derives from them.

Reading a file into it is trainer/config.py's job; the cross-field checks are trainer/config_validate.py's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

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
    """Linear weights ~ normal(0, init_std), biases 0, norms 1 (SpecForge's configs/qwen3-8b-dflash.json
    initializer_range, as HF's PreTrainedModel._init_weights applies it); 0 = torch's default Linear
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
    block_buckets: int = 4
    """Short responses trimmed (trainer/trim.py): a replica's batch builds num_anchors, /2, /4, ... blocks (this
    many sizes, the smallest that holds every supervised block), each size compiled at warm-up; 1 = always
    num_anchors."""
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
