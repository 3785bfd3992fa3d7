"""Reading a block-diffusion checkpoint directory: its family (by config.json's model_type, never by
name), the transformers-style classes that hold its weights, and its mask and EOS ids and block size."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import (
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from spot.targets.llada import KEY_MAPPING as LLADA_KEY_MAPPING
from spot.targets.llada import LLaDAForCausalLM, llada_config
from spot.targets.llada2 import LLaDA2Config, LLaDA2ForCausalLM
from spot.targets.placement import Placement

# Fields of a config.json that only the checkpoint's remote code reads.
_REMOTE_ONLY_FIELDS = ("auto_map", "architectures", "attn_implementation", "model_type")


@dataclass(frozen=True)
class Family:
    """How spot-eval runs one model_type.

    config: config.json's fields (remote-only ones dropped) -> the config of `model`.
    attention: "block_causal" (blocks from position 0: an exact prefix cache, spot.targets.block_causal)
        or "bidirectional" (the whole canvas: an approximate cache, spot.targets.dual_cache).
    block_size: the published block size where config.json names none.
    key_mapping: checkpoint weight name (regex) -> `model`'s name, for transformers' from_pretrained.
    shift: position i's logits come from the hidden state at i - 1 (Dream).
    """

    config: Callable[..., PretrainedConfig]
    model: type[PreTrainedModel]
    attention: str = "block_causal"
    block_size: int | None = None
    key_mapping: dict[str, str] = field(default_factory=dict)
    shift: bool = False


# config.json's model_type -> its family. Block sizes a config.json does not name: LLaDA2.0's model card
# and reference generate decode in blocks of 32 [SRC: inclusionAI/LLaDA2.0-mini; SGLang's DllmConfig
# agrees]; LLaDA's generate.py and Fast-dLLM's scripts use 32 for LLaDA and Dream [SRC].
FAMILIES: dict[str, Family] = {
    "sdar": Family(Qwen3Config, Qwen3ForCausalLM),
    "qwen3": Family(Qwen3Config, Qwen3ForCausalLM),
    "sdar_moe": Family(Qwen3MoeConfig, Qwen3MoeForCausalLM),
    "qwen3_moe": Family(Qwen3MoeConfig, Qwen3MoeForCausalLM),
    "llada2_moe": Family(LLaDA2Config, LLaDA2ForCausalLM, block_size=32),
    "llada": Family(llada_config, LLaDAForCausalLM, "bidirectional", 32, LLADA_KEY_MAPPING),
    "Dream": Family(Qwen2Config, Qwen2ForCausalLM, "bidirectional", 32, shift=True),
}
ATTENTIONS = ("block_causal", "bidirectional")  # the two target classes spot.targets.from_pretrained picks between


def register_family(model_type: str, family: Family) -> None:
    """Teach `read_checkpoint` a model_type (an outside package's family: spot_eval discovers them).

    The first family of a model_type keeps it (the built-in ones first): a checkpoint must not decode one way or
    another by which packages happen to be installed.

    Raises:
        ValueError naming the model_type and both families where it is taken, or the attention where it is not one
        that a target class decodes.
    """
    if not isinstance(model_type, str) or not model_type:
        raise ValueError(f"model_type must be a non-empty string (config.json's model_type), got {model_type!r}")
    if not isinstance(family, Family):
        raise ValueError(f"model_type {model_type!r}: the family must be a spot.targets.checkpoint.Family, got "
                         f"{type(family).__name__}")
    taken = FAMILIES.get(model_type)
    if taken is not None:
        raise ValueError(f"model_type {model_type!r} is taken by {taken.model.__name__}'s family, which keeps it; "
                         f"{family.model.__name__}'s family needs a model_type of its own")
    if family.attention not in ATTENTIONS:
        raise ValueError(f"model_type {model_type!r}: attention {family.attention!r} is not one a target decodes; "
                         f"choose {' or '.join(ATTENTIONS)}")
    FAMILIES[model_type] = family


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint directory says about itself."""

    path: str
    model_type: str
    mask_id: int
    block_size: int  # the block length the checkpoint was trained with
    eos_ids: frozenset[int]
    max_positions: int
    vocab_size: int


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint directory parsed once (`read_checkpoint`); every loader takes this rather than the path, so
    that config.json and the tokenizer's files are read once however many layers the load passes through."""

    config: PretrainedConfig  # of `family.model`, the class that holds the weights
    info: CheckpointInfo

    @property
    def path(self) -> Path:
        return Path(self.info.path)

    @property
    def family(self) -> Family:
        return FAMILIES[self.info.model_type]


def parsed(checkpoint: str | Path | Checkpoint) -> Checkpoint:
    """`checkpoint` as parsed: itself, or its directory read by `read_checkpoint`."""
    return checkpoint if isinstance(checkpoint, Checkpoint) else read_checkpoint(checkpoint)


def decode_block_length(checkpoint: Checkpoint, block_length: int | None) -> int:
    """The block length to decode with: `block_length`, or the checkpoint's own where it is None. A length the
    checkpoint was not trained with is allowed (the decode is still exact, only off its training) with a warning."""
    if block_length is None:
        return checkpoint.info.block_size
    if block_length < 1:
        raise ValueError(f"block_length must be >= 1, got {block_length}")
    if block_length != checkpoint.info.block_size:
        warnings.warn(
            f"decode block length {block_length} differs from the checkpoint's block_size {checkpoint.info.block_size} "
            f"({checkpoint.path}); the target was trained for {checkpoint.info.block_size}-token blocks",
            stacklevel=3,
        )
    return block_length


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Map a block-diffusion checkpoint's config.json to a plain config of the transformers-style class
    that holds its weights, by its model_type (`FAMILIES`): SDAR (dense `sdar`, MoE `sdar_moe`, or an
    SDAR-style Qwen3 one), LLaDA2.0 (`llada2_moe`), LLaDA (`llada`) and Dream (`Dream`).

    The mask and EOS ids come from config.json (and generation_config.json) where it names them, else
    from the tokenizer's own special tokens (LLaDA2.0's config.json names neither); the block size
    from config.json, else the family's published one (`Family.block_size`).

    Raises:
        FileNotFoundError / ValueError with a message naming the directory and the missing field.
    """
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{path} is not a model directory: it has no config.json")
    raw = json.loads(config_file.read_text())
    model_type = raw.get("model_type", "qwen3")
    if model_type not in FAMILIES:
        raise ValueError(
            f"{config_file} declares model_type {model_type!r}, which spot-eval does not load; "
            f"supported: {', '.join(FAMILIES)}"
        )
    eos: set[int] = set()
    generation_file = path / "generation_config.json"
    sources = [raw.get("eos_token_id")]
    if generation_file.is_file():
        sources.append(json.loads(generation_file.read_text()).get("eos_token_id"))
    for value in sources:
        if isinstance(value, int):
            eos.add(value)
        elif isinstance(value, list):
            eos.update(int(v) for v in value)
    # The tokenizer's files only where config.json leaves an id out (tokenizer.json can be megabytes).
    special = _special_tokens(path) if raw.get("mask_token_id") is None or not eos else {}
    mask_id = raw.get("mask_token_id", special.get("mask_token"))
    if not eos and "eos_token" in special:
        eos.add(special["eos_token"])
    family = FAMILIES[model_type]
    block_size = raw.get("block_size", family.block_size)
    for name, value, hint in (("mask_token_id", mask_id, "or a mask_token in tokenizer_config.json"),
                              ("block_size", block_size, "")):
        if value is None:
            raise ValueError(
                f"{config_file} has no {name!r}{' (' + hint + ')' if hint else ''}: this is not a block-diffusion "
                f"checkpoint that spot-eval knows. Add {name} to config.json (SDAR uses mask_token_id 151669 and "
                "block_size 4/8/16/32/64)."
            )
    fields = {k: v for k, v in raw.items() if k not in _REMOTE_ONLY_FIELDS}
    config = family.config(**fields)
    if not eos:
        raise ValueError(f"{path} declares no eos_token_id in config.json or generation_config.json, and its tokenizer no eos_token")
    info = CheckpointInfo(
        path=str(path),
        model_type=model_type,
        mask_id=int(mask_id),
        block_size=int(block_size),
        eos_ids=frozenset(eos),
        max_positions=int(config.max_position_embeddings),
        vocab_size=int(config.vocab_size),
    )
    if not 0 <= info.mask_id < info.vocab_size:
        raise ValueError(f"{config_file}: mask_token_id {info.mask_id} is outside the vocabulary (size {info.vocab_size})")
    return Checkpoint(config, info)


@dataclass(frozen=True)
class Loaded:
    """What a target class needs from its checkpoint (`load`)."""

    checkpoint: Checkpoint
    block_length: int  # the decode block length (`decode_block_length`)
    tokenizer: PreTrainedTokenizerBase
    model: PreTrainedModel


def load(
    checkpoint: str | Path | Checkpoint,
    attention: str,
    loader: str,
    block_length: int | None,
    device: str | torch.device,
    dtype: torch.dtype,
    trust_remote_code: bool = False,
    placement: Placement | None = None,
    **weights,
) -> Loaded:
    """A checkpoint's parts, checked the same way for every target class: parsed once, of the family `attention`
    that the class `loader` decodes, the decode block length, a tokenizer that holds the mask token, the weights
    (on `device`, or spread by `placement`: spot.targets.placement)."""
    checkpoint = parsed(checkpoint)
    if checkpoint.family.attention != attention:
        other = "BlockCausalTarget" if checkpoint.family.attention == "block_causal" else "DualCacheTarget"
        raise ValueError(f"{checkpoint.path} holds a {checkpoint.info.model_type} model, whose attention is "
                         f"{checkpoint.family.attention}, not {loader}'s: load it with spot.targets.{other} "
                         "(spot.targets.from_pretrained does)")
    block_length = decode_block_length(checkpoint, block_length)
    tokenizer = load_tokenizer(checkpoint, trust_remote_code)
    if placement is not None:
        return Loaded(checkpoint, block_length, tokenizer, load_weights(checkpoint, dtype, **weights, **placement.kwargs()))
    return Loaded(checkpoint, block_length, tokenizer, load_weights(checkpoint, dtype, **weights).to(device))


def empty_model(checkpoint: Checkpoint, dtype: torch.dtype) -> PreTrainedModel:
    """The checkpoint's model without weights (every parameter on the meta device, in `dtype`): its module names and
    sizes, which is all a device map is planned from (spot.targets.placement.plan)."""
    from accelerate import init_empty_weights

    with init_empty_weights():
        return checkpoint.family.model._from_config(checkpoint.config, dtype=dtype)


def load_tokenizer(checkpoint: Checkpoint, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The directory's tokenizer, checked to hold the mask token the config names (without it the prompt's text
    could never show a mask, and decoded masks would vanish from the output)."""
    path, mask_id = checkpoint.path, checkpoint.info.mask_id
    # Our config, not the directory's model_type (sdar): transformers would warn that it does not know it.
    tokenizer = AutoTokenizer.from_pretrained(str(path), config=checkpoint.config, trust_remote_code=trust_remote_code)
    if tokenizer.convert_ids_to_tokens(mask_id) is None:
        raise ValueError(f"the tokenizer in {path} has no token for mask_token_id {mask_id}; add the mask token to the "
                         "tokenizer (SDAR: <|MASK|>, LLaDA: <|mdm_mask|>)")
    return tokenizer


def load_weights(checkpoint: Checkpoint, dtype: torch.dtype, **kwargs) -> PreTrainedModel:
    """The family's model with the directory's weights (renamed by its key_mapping).

    Raises:
        ValueError naming the weights the model needs and the directory lacks (transformers would
        initialise them at random and only warn)."""
    path, family = checkpoint.path, checkpoint.family
    model, report = family.model.from_pretrained(
        str(path), config=checkpoint.config, dtype=dtype, key_mapping=family.key_mapping or None, output_loading_info=True,
        **kwargs,
    )
    if report["missing_keys"]:
        missing = sorted(report["missing_keys"])
        raise ValueError(
            f"{path} lacks {len(missing)} weights that a {type(model).__name__} needs ({', '.join(missing[:4])}"
            f"{', ...' if len(missing) > 4 else ''}); its files do not hold this model_type's published weight names"
        )
    return model


def _special_tokens(path: Path) -> dict[str, int]:
    """The ids of tokenizer_config.json's mask_token and eos_token, looked up in the added tokens of
    tokenizer_config.json (older files) and tokenizer.json (read without loading the tokenizer); {}
    where there are none."""
    config_file, tokenizer_file = path / "tokenizer_config.json", path / "tokenizer.json"
    if not config_file.is_file():
        return {}
    raw = json.loads(config_file.read_text())
    ids = {entry.get("content"): int(i) for i, entry in (raw.get("added_tokens_decoder") or {}).items() if isinstance(entry, dict)}
    if tokenizer_file.is_file():
        ids |= {entry["content"]: int(entry["id"]) for entry in json.loads(tokenizer_file.read_text()).get("added_tokens", [])}
    found = {}
    for name in ("mask_token", "eos_token"):
        token = raw.get(name)
        token = token.get("content") if isinstance(token, dict) else token
        if token in ids:
            found[name] = ids[token]
    return found
