"""Recorded draft-free trajectories on disk: compact shards plus one manifest.

A trajectory directory holds `manifest.json` and `shard-00000.pt`, `shard-00001.pt`, ... Each shard
is a `torch.save`d dict of plain tensors for `shard_size` consecutive requests of the collect plan,
every block of every request concatenated along the step axis:

    block_request [B] int64       the request index (= the prompt's index in corpus.training_pairs)
    block_index [B] int64         the block's index in the sequence (part of the noise key)
    block_temperature [B] float32
    block_steps [B] int64         S_b, the steps of block b
    states [sum(S_b + 1), K]      int16 when the vocabulary fits, else int32
    topk_logprobs [sum(S_b), K, k] float16 (log-softmax of the logits behind each step)
    topk_ids [sum(S_b), K, k]     int16 / int32
    hidden [sum(S_b), K, R]       float16, with --hidden-dims R: the hidden states behind each step,
                                  projected on `projections.pt`'s hidden basis

A shard is finished when its file exists and the manifest lists it; both are written through a
temp file and a rename, so a crash never leaves a half shard that a rerun would trust.

The manifest records the target fingerprint (`spot_eval.checkpoints.fingerprint.target_fingerprint`: tokenizer
and weights digests, block length, policy) and the settings that fix the recorded data; a rerun
with any of them changed refuses to mix data in the same directory.

With hidden states, `projections.pt` holds what SPOT-Sets' set model reads them and the tokens through
(spot.drafters.set_model.Projection, fitted on this target): {"hidden": the hidden-state basis, fitted on
the first shard's hidden states before it is written; "embedding": the token-embedding basis;
"token_coords": [V, R_e] every token's projected embedding}.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from spot.drafters.order_examples import RecordedBlock
from spot_eval.checkpoints.atomic_file import write_atomically
from spot_eval.checkpoints.fingerprint import fingerprint_mismatch

FORMAT = "spot-trajectories/1"
MANIFEST = "manifest.json"
PROJECTIONS = "projections.pt"


@dataclass(frozen=True)
class CollectSettings:
    """Everything besides the target that fixes the recorded data (except how many prompts)."""

    gen_length: int
    topk: int
    seed: int
    temperatures: tuple[float, ...]  # request i of the plan decodes at temperatures[i % len]
    chat: bool
    shard_size: int
    threshold: float  # used by policy "threshold" only
    sources: tuple[str, ...]
    hidden_dims: int = 0  # hidden-state components recorded per step (0: none)
    embedding_dims: int = 0  # token-embedding components in projections.pt (with hidden_dims)


@dataclass(frozen=True)
class ShardEntry:
    file: str
    index: int
    first: int  # the shard covers plan positions first .. first + count - 1
    count: int
    requests: int  # decoded (prompts too long for the model are skipped)
    blocks: int
    steps: int


@dataclass(frozen=True)
class Manifest:
    fingerprint: dict
    settings: CollectSettings
    mask_id: int
    vocab_size: int
    shards: tuple[ShardEntry, ...]

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "fingerprint": self.fingerprint,
                "settings": asdict(self.settings),
                "mask_id": self.mask_id,
                "vocab_size": self.vocab_size,
                "shards": [asdict(s) for s in self.shards],
            },
            indent=1,
        )

    def mismatch(self, other: Manifest) -> list[str]:
        """The fingerprint and settings fields on which two manifests differ."""
        mine, theirs = asdict(self.settings), asdict(other.settings)
        settings = [f"{k}: {mine[k]!r} vs {theirs[k]!r}" for k in mine if mine[k] != theirs[k]]
        return fingerprint_mismatch(self.fingerprint, other.fingerprint) + settings


def shard_file(index: int) -> str:
    return f"shard-{index:05d}.pt"


def write_projections(directory: Path, projections: dict) -> None:
    write_atomically(directory / PROJECTIONS, lambda tmp: torch.save(projections, tmp))


def read_projections(directory: str | Path) -> dict:
    """projections.pt's dict (module docstring), checked to hold its three entries."""
    path = Path(directory) / PROJECTIONS
    if not path.is_file():
        raise FileNotFoundError(f"{directory} holds no {PROJECTIONS}: collect with --hidden-dims R for a set model")
    try:
        raw = torch.load(path, weights_only=True, map_location="cpu")
        return {"hidden": raw["hidden"], "embedding": raw["embedding"], "token_coords": raw["token_coords"].float()}
    except Exception as err:  # torch.load raises many kinds for a damaged file
        raise ValueError(f"{path} is corrupt ({type(err).__name__}: {err}); delete the directory and collect again") from None


def write_manifest(directory: Path, manifest: Manifest) -> None:
    write_atomically(directory / MANIFEST, lambda tmp: tmp.write_text(manifest.to_json()))


def read_manifest(directory: str | Path) -> Manifest:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{directory} holds no trajectories ({MANIFEST} is missing); record some with spot-eval collect")
    try:
        raw = json.loads(path.read_text())
        if raw.get("format") != FORMAT:
            raise ValueError(f"format {raw.get('format')!r}, expected {FORMAT!r}")
        settings = raw["settings"]
        settings = CollectSettings(**{**settings, "temperatures": tuple(settings["temperatures"]), "sources": tuple(settings["sources"])})
        shards = tuple(ShardEntry(**s) for s in raw["shards"])
        return Manifest(raw["fingerprint"], settings, int(raw["mask_id"]), int(raw["vocab_size"]), shards)
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not a valid trajectory manifest ({err}); delete the directory and collect again") from None


def id_dtype(vocab_size: int) -> torch.dtype:
    return torch.int16 if vocab_size <= 32768 else torch.int32


@dataclass(frozen=True)
class BlockRecord:
    """One recorded block before packing: states [S + 1, K], topk_logprobs / topk_ids [S, K, k]."""

    request: int
    block: int
    temperature: float
    states: torch.Tensor
    topk_logprobs: torch.Tensor
    topk_ids: torch.Tensor
    hidden: torch.Tensor | None = None  # [S, K, R] projected hidden states


def pack_shard(records: list[BlockRecord], vocab_size: int, block_length: int, topk: int) -> dict[str, torch.Tensor]:
    """The shard dict of the module docstring (empty tensors when every prompt was skipped)."""
    ids = id_dtype(vocab_size)

    def cat(tensors: list[torch.Tensor], empty: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return (torch.cat(tensors) if tensors else torch.empty(empty)).to(dtype)

    hidden = [r.hidden for r in records if r.hidden is not None]
    extra = {"hidden": torch.cat(hidden).to(torch.float16)} if hidden else {}
    return extra | {
        "block_request": torch.tensor([r.request for r in records], dtype=torch.int64),
        "block_index": torch.tensor([r.block for r in records], dtype=torch.int64),
        "block_temperature": torch.tensor([r.temperature for r in records], dtype=torch.float32),
        "block_steps": torch.tensor([r.topk_ids.shape[0] for r in records], dtype=torch.int64),
        "states": cat([r.states for r in records], (0, block_length), ids),
        "topk_logprobs": cat([r.topk_logprobs for r in records], (0, block_length, topk), torch.float16),
        "topk_ids": cat([r.topk_ids for r in records], (0, block_length, topk), ids),
    }


def write_shard(path: Path, shard: dict[str, torch.Tensor]) -> None:
    write_atomically(path, lambda tmp: torch.save(shard, tmp))


def unpack_shard(shard: dict[str, torch.Tensor], mask_id: int, seed: int) -> list[RecordedBlock]:
    """The shard's blocks; logprobs and ids stay compact views (make_examples widens them per batch)."""
    blocks, step, row = [], 0, 0
    for i, n in enumerate(shard["block_steps"].tolist()):
        blocks.append(
            RecordedBlock(
                states=shard["states"][row : row + n + 1].long(),
                topk_logprobs=shard["topk_logprobs"][step : step + n],
                topk_ids=shard["topk_ids"][step : step + n],
                mask_id=mask_id,
                seed=seed,
                request=int(shard["block_request"][i]),
                block=int(shard["block_index"][i]),
                temperature=float(shard["block_temperature"][i]),
                hidden=shard["hidden"][step : step + n] if "hidden" in shard else None,
            )
        )
        step, row = step + n, row + n + 1
    return blocks


def read_blocks(directory: str | Path, policy: str) -> list[RecordedBlock]:
    """Every recorded block in a trajectory directory, in shard order.

    Raises:
        ValueError: the shards were recorded with another policy than `policy`, or are damaged.
        FileNotFoundError: no manifest, or a shard it lists is gone.
    """
    manifest = read_manifest(directory)
    recorded = manifest.fingerprint.get("policy")
    if recorded != policy:
        raise ValueError(
            f"trajectory shards from a different policy: {directory} was recorded with policy {recorded!r}, "
            f"but policy {policy!r} was asked for; collect with --policy {policy} or train for {recorded!r}"
        )
    blocks = []
    for entry in manifest.shards:
        path = Path(directory) / entry.file
        if not path.is_file():
            raise FileNotFoundError(f"{path} is listed in the manifest but missing; rerun spot-eval collect to redo it")
        try:
            shard = torch.load(path, weights_only=True, map_location="cpu")
            read = unpack_shard(shard, manifest.mask_id, manifest.settings.seed)
        except Exception as err:  # torch.load raises many kinds for a damaged file
            raise ValueError(
                f"trajectory shard {path} is corrupt or truncated ({type(err).__name__}); delete it and rerun "
                "spot-eval collect with the same flags to record it again"
            ) from None
        if len(read) != entry.blocks:
            raise ValueError(f"{path} holds {len(read)} blocks, its manifest entry says {entry.blocks}; collect it again")
        blocks += read
    return blocks
