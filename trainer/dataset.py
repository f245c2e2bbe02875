"""Training batches, and the generated data directory: its on-disk format, written shard by shard, read back.

`Batch` is what every data source yields (`MarkovData` in trainer/data.py, `GeneratedData` here).

Output of `trainer.datagen`: `meta.json` (settings + counts) and `shard-NNNNN.pt` files, each holding `shard_size`
consecutive prompts: flat token ids (prompt + response), per-sample offsets and the prompt length — the
prompt/response boundary, so training anchors come from responses only. A shard is written atomically when
complete, so an interrupted run resumes at the first missing shard. `GeneratedData` reads a directory back as
fixed-shape `Batch`es, a drop-in for `MarkovData`.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from trainer.checkpoint import atomic_write_bytes
from trainer.hf_config import read_json_object
from trainer.oneline import first_line

FORMAT = 1


@dataclass(frozen=True)
class Batch:
    step: int
    ids: Tensor  # [N, T] long
    anchors: Tensor  # [N, A] long, sorted, response positions in [prompt_len, ends - 1]
    ends: Tensor
    """[N] long: the first position that is not a real token (padding, or T). A block may run past it: its labels
    there are masked (trainer/loss.py label_mask); an anchor at ends - 1 is an empty block (every label masked)."""


class DataError(Exception):
    """Bad prompt file, bad or mismatched data directory; the message names the file (and line)."""


def shard_path(out: Path, index: int) -> Path:
    return out / f"shard-{index:05d}.pt"


def write_shard(path: Path, indices: list[int], samples: list[tuple[list[int], list[int], bool]]) -> None:
    flat = [t for p, r, _ in samples for t in p + r]
    lengths = [len(p) + len(r) for p, r, _ in samples]
    state = {"indices": torch.tensor(indices, dtype=torch.long),
             "prompt_lens": torch.tensor([len(p) for p, _, _ in samples], dtype=torch.long),
             "lengths": torch.tensor(lengths, dtype=torch.long),
             "eos": torch.tensor([e for _, _, e in samples], dtype=torch.bool),
             "ids": torch.tensor(flat, dtype=torch.int32)}
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write_bytes(path, buf.getvalue())


@dataclass(frozen=True)
class Sample:
    index: int
    ids: Tensor  # [L] int32 (a view into its shard): prompt + response
    prompt_len: int
    eos: bool


def read_samples(data_dir: str | Path) -> list[Sample]:
    """Every stored sample, in prompt order."""
    data_dir = Path(data_dir)
    if not (data_dir / "meta.json").exists():
        raise DataError(f"{data_dir}: not a generated data directory (no meta.json)")
    samples = []
    for path in sorted(data_dir.glob("shard-*.pt")):
        try:
            st = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # a torn or foreign file: say which
            raise DataError(f"{path}: cannot load ({first_line(e)})") from None
        ends = st["lengths"].cumsum(0).tolist()
        starts = [0] + ends[:-1]
        for j, (a, b) in enumerate(zip(starts, ends, strict=True)):
            samples.append(Sample(int(st["indices"][j]), st["ids"][a:b], int(st["prompt_lens"][j]),
                                  bool(st["eos"][j])))
    return sorted(samples, key=lambda s: s.index)


def read_meta(data_dir: str | Path) -> dict[str, Any]:
    return read_json_object(Path(data_dir) / "meta.json", DataError,
                            missing=f"{data_dir}: not a generated data directory (no meta.json)")


def summarize(data_dir: str | Path) -> dict[str, Any]:
    samples = read_samples(data_dir)
    resp = [len(s.ids) - s.prompt_len for s in samples]
    return {"samples": len(samples), "response_tokens": sum(resp),
            "mean_response_tokens": round(sum(resp) / max(1, len(resp)), 1),
            "ended_with_eos": sum(s.eos for s in samples)}


def window(length: int, prompt_len: int, seq_len: int) -> tuple[int, int]:
    """(start, prompt_len inside the window) of the `seq_len` tokens used for training: as much response as fits,
    with at least a quarter window of prompt before it when the prompt is that long."""
    start = max(0, min(prompt_len - seq_len // 4, length - seq_len))
    return start, prompt_len - start


class GeneratedData:
    """Batches from a generated directory, same shapes as `MarkovData.batch`: ids [N, seq_len], anchors [N, A]
    drawn from response positions that have a next token (a block may run past the response: its overflow is
    masked), distinct; a response with fewer such positions than A fills the rest with empty blocks at its last
    token. Responses of one token are skipped. A pure function of (seed, step)."""

    def __init__(self, data_dir: str | Path, seq_len: int, block_size: int, num_anchors: int, seed: int,
                 vocab_size: int = 0) -> None:
        """`vocab_size`: the training target's; data generated by a target with a larger vocabulary is refused
        here, in one line, rather than as an embedding index error inside the coordinator thread."""
        self.seq_len, self.block_size, self.num_anchors, self.seed = seq_len, block_size, num_anchors, seed
        meta = read_meta(data_dir)
        if vocab_size and int(meta.get("vocab_size") or 0) > vocab_size:
            raise DataError(f"{data_dir}: generated by a target with vocab_size {meta['vocab_size']} > this "
                            f"target's {vocab_size} ({meta.get('target', '?')})")
        self.pad_id = int(meta.get("pad_token_id") or 0)
        self.rows: list[tuple[Tensor, int]] = []  # (ids in window, first anchor); last anchor = len(ids) - 2
        for s in read_samples(data_dir):
            start, p = window(len(s.ids), s.prompt_len, seq_len)
            ids = s.ids[start:start + seq_len]
            if len(ids) - 2 >= p:
                self.rows.append((ids, p))
        if not self.rows:
            raise DataError(f"{data_dir}: no sample has a response of at least 2 tokens")
        self._perms: dict[int, Tensor] = {}

    def _order(self, epoch: int) -> Tensor:
        if epoch not in self._perms:
            gen = torch.Generator().manual_seed(self.seed * 7919 + epoch)
            self._perms = {epoch: torch.randperm(len(self.rows), generator=gen)}
        return self._perms[epoch]

    def __len__(self) -> int:
        """Samples in one epoch."""
        return len(self.rows)

    def rooms(self) -> list[int]:
        """Each sample's number of anchor positions (response positions with a next token): the blocks it can fill
        (trainer/trim.py)."""
        return [len(ids) - 1 - lo for ids, lo in self.rows]

    def batch(self, step: int, n_seqs: int) -> Batch:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        ids = torch.full((n_seqs, self.seq_len), self.pad_id, dtype=torch.long)
        anchors = torch.empty((n_seqs, self.num_anchors), dtype=torch.long)
        ends = torch.empty(n_seqs, dtype=torch.long)
        for j in range(n_seqs):
            pos = step * n_seqs + j
            row, lo = self.rows[int(self._order(pos // len(self.rows))[pos % len(self.rows)])]
            ids[j, : len(row)] = row
            ends[j] = end = len(row)
            room = end - 1 - lo  # anchors lo .. end-2: each has at least one real label
            pick = torch.randperm(room, generator=gen)[: self.num_anchors] + lo
            if room < self.num_anchors:  # short response: empty blocks at the last token, not repeated anchors
                pick = torch.cat([pick, torch.full((self.num_anchors - room,), end - 1, dtype=torch.long)])
            anchors[j] = pick.sort().values
        return Batch(step=step, ids=ids, anchors=anchors, ends=ends)
