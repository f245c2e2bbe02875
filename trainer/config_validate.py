"""The config's cross-field checks, run once after reading (trainer/config.py load_config): each error names
the key it is about, so a bad value fails before any model loads.
"""

from __future__ import annotations

from trainer.config_schema import Config, ConfigError

COMPILE_STRATEGIES = ("warmup", "naive", "off")
ATTENTION_PATHS = ("auto", "sdpa", "flex")
FAILURE_POLICIES = ("abort", "continue")
SCHEDULES = ("cosine", "constant")
DIST_BACKENDS = ("auto", "gloo", "nccl")
LAYOUTS = ("threads", "processes")
REDUCE_DTYPES = ("bf16", "fp32")
TARGET_DTYPES = ("auto", "bfloat16", "float32")


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
    for key in ("target.micro_batches", "train.batch_size", "train.num_anchors", "train.block_buckets",
                "train.log_interval", "train.keep_checkpoints", "train.queue_depth"):
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
    need(rt.compile_strategy == "off" or tr.block_buckets <= rt.recompile_limit, "train.block_buckets",
         f"{tr.block_buckets} trimmed sizes are compiled at warm-up, more than runtime.recompile_limit "
         f"({rt.recompile_limit}) allows (dynamo would fall back to eager): lower it or raise the limit")


def _is_cuda(dev: str) -> bool:
    head, _, idx = dev.partition(":")
    return head == "cuda" and (idx == "" or idx.isdigit())
