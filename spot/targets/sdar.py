"""SDAR-style targets: transformers-native Qwen3 (dense or MoE) decoders with block-causal attention.

SDAR checkpoints (JetLM/SDAR-*-Chat[-bN], and the MoE SDAR-30B-A3B-Chat/-Sci) ship Qwen3 / Qwen3-MoE
weight names under `model_type: "sdar"` / `"sdar_moe"` and remote code; we read their config.json
ourselves, build a plain `Qwen3Config` / `Qwen3MoeConfig`, and load the weights into
`Qwen3ForCausalLM` / `Qwen3MoeForCausalLM` without remote code, with SDAR's RMSNorm numerics
(`SDARRMSNorm`). The attention pattern reaches the model only as an
explicit 4D boolean mask argument (True = may attend):

    rows of the pending prefix  -> the cache, and pending columns of the same or an earlier block
    rows of piece r             -> the cache, the whole pending prefix, and piece r itself

"Pending" holds completed blocks (the prompt's complete blocks, then each finished block) whose
KV has not been computed yet: appending them rides along with the next verify forward instead of
costing a forward of its own. The KV of the pieces is never kept: after each forward the cache is
cropped back to the completed blocks.

With `exact=True` the same rows go through the model, but attention follows `PieceLayout`
(spot.targets.attention): each piece attends to exactly what it may see, in a batch of its own, so
its logits equal those of a one-piece forward of its state bit for bit, in any dtype. Without it,
the masked-out pieces still take part in the attention kernel's reductions, and a state's logits
move by rounding with the piece count (bench/verify_exactness.py).
"""

from __future__ import annotations

import json
import os
import types
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import (
    AutoTokenizer,
    DynamicCache,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts, Qwen3MoeRMSNorm

from spot.targets.attention import PIECES, PieceLayout
from spot.targets.llada2 import LLaDA2Config, LLaDA2ForCausalLM
from spot.targets.rows import in_chunks

SAFE_FRACTION = 0.5  # of the free memory one verify may plan to use: the estimate leaves out temporaries
# Fields of SDAR's config.json that only its remote code reads.
_REMOTE_ONLY_FIELDS = ("auto_map", "architectures", "attn_implementation", "model_type")
# config.json's model_type -> the transformers classes that hold its weights (same names, no remote code).
FAMILIES: dict[str, tuple[type[PretrainedConfig], type[PreTrainedModel]]] = {
    "sdar": (Qwen3Config, Qwen3ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "sdar_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
    "llada2_moe": (LLaDA2Config, LLaDA2ForCausalLM),
}
# The block size of a family whose config.json names none: LLaDA2.0's model card and reference
# generate decode in blocks of 32 [SRC: inclusionAI/LLaDA2.0-mini; SGLang's DllmConfig agrees].
BLOCK_SIZES = {"llada2_moe": 32}


class SDARRMSNorm(nn.Module):
    """RMSNorm as SDAR's released inference path computes it (flash-attn's Triton `rms_norm_fn`): the
    input normalised in fp32 and multiplied by the weight in fp32, then rounded to the input dtype once.
    transformers' Qwen3RMSNorm rounds the normalised input first and multiplies in the input dtype: the
    same in fp32, up to a rounding apart in bf16, where it was the main difference from SDAR's logits."""

    def __init__(self, weight: nn.Parameter, eps: float) -> None:
        super().__init__()
        self.weight = weight
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (x * self.weight.float()).to(hidden_states.dtype)


def _row_invariant_experts(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
    """Qwen3-MoE's experts (transformers' Qwen3MoeExperts weights, gate_up_proj [E, 2F, d] and
    down_proj [E, d, F]) run on every expert's group of tokens in fixed chunks (spot.targets.rows): how many
    tokens an expert gets depends on the other pieces of a verify, and the exact layout needs a token's
    output not to.

    hidden_states: [T, d]; top_k_index, top_k_weights: [T, k]. Returns [T, d]: per token the weighted sum
    of its experts' outputs, added in expert order (the same order whatever the grouping)."""
    out = torch.zeros_like(hidden_states)
    for expert in top_k_index.unique().tolist():
        tokens, slot = torch.where(top_k_index == expert)  # [n] each

        def mlp(x: torch.Tensor, expert: int = expert) -> torch.Tensor:  # [ROWS, d] -> [ROWS, d]
            gate, up = nn.functional.linear(x, self.gate_up_proj[expert]).chunk(2, dim=-1)  # [ROWS, F] each
            return nn.functional.linear(self.act_fn(gate) * up, self.down_proj[expert])

        y = in_chunks(mlp, hidden_states[tokens])  # [n, d]
        out.index_add_(0, tokens, (y * top_k_weights[tokens, slot, None]).to(out.dtype))
    return out


def use_sdar_norms(model: nn.Module) -> None:
    """Every Qwen3 / Qwen3-MoE RMSNorm of `model` (per-head q/k norms, layer and final norms) computed
    as SDAR computes it, on the same weights."""
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if isinstance(child, (Qwen3RMSNorm, Qwen3MoeRMSNorm)):
                setattr(parent, name, SDARRMSNorm(child.weight, child.variance_epsilon))


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint directory says about itself."""

    path: str
    mask_id: int
    block_size: int  # the block length the checkpoint was trained with
    eos_ids: frozenset[int]
    max_positions: int
    vocab_size: int


def read_checkpoint(path: str | Path) -> tuple[PretrainedConfig, CheckpointInfo]:
    """Map a block-diffusion checkpoint's config.json to a plain config of the transformers-style class
    that holds its weights, by its model_type (`FAMILIES`): SDAR (dense `sdar`, MoE `sdar_moe`, or an
    SDAR-style Qwen3 one) and LLaDA2.0 (`llada2_moe`).

    The mask and EOS ids come from config.json (and generation_config.json) where it names them, else
    from the tokenizer's own special tokens (LLaDA2.0's config.json names neither); the block size
    from config.json, else the family's published one (`BLOCK_SIZES`).

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
    special = _special_tokens(path)
    mask_id = raw.get("mask_token_id", special.get("mask_token"))
    block_size = raw.get("block_size", BLOCK_SIZES.get(model_type))
    for field, value, hint in (("mask_token_id", mask_id, "or a mask_token in tokenizer_config.json"),
                               ("block_size", block_size, "")):
        if value is None:
            raise ValueError(
                f"{config_file} has no {field!r}{' (' + hint + ')' if hint else ''}: this is not a block-diffusion "
                f"checkpoint that spot-eval knows. Add {field} to config.json (SDAR uses mask_token_id 151669 and "
                "block_size 4/8/16/32/64)."
            )
    fields = {k: v for k, v in raw.items() if k not in _REMOTE_ONLY_FIELDS}
    config = FAMILIES[model_type][0](**fields)
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
    if not eos and "eos_token" in special:
        eos.add(special["eos_token"])
    if not eos:
        raise ValueError(f"{path} declares no eos_token_id in config.json or generation_config.json, and its tokenizer no eos_token")
    info = CheckpointInfo(
        path=str(path),
        mask_id=int(mask_id),
        block_size=int(block_size),
        eos_ids=frozenset(eos),
        max_positions=int(config.max_position_embeddings),
        vocab_size=int(config.vocab_size),
    )
    if not 0 <= info.mask_id < info.vocab_size:
        raise ValueError(f"{config_file}: mask_token_id {info.mask_id} is outside the vocabulary (size {info.vocab_size})")
    return config, info


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


class SDARTarget:
    """A block-diffusion target over a `Qwen3ForCausalLM` (see the module docstring)."""

    def __init__(
        self,
        model: Qwen3ForCausalLM | Qwen3MoeForCausalLM,
        mask_id: int,
        eos_ids: frozenset[int],
        block_length: int,
        tokenizer: PreTrainedTokenizerBase | None = None,
        name: str = "",
        exact: bool = False,
    ) -> None:
        if block_length < 1:
            raise ValueError(f"block_length must be >= 1, got {block_length}")
        self.exact = exact
        if exact:
            model.set_attn_implementation(PIECES)
            for module in model.modules():
                if isinstance(module, Qwen3MoeExperts):
                    module.forward = types.MethodType(_row_invariant_experts, module)
        use_sdar_norms(model)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.mask_id = mask_id
        self.eos_ids = frozenset(eos_ids)
        self.block_length = block_length
        self.vocab_size = int(model.config.vocab_size)
        self.max_positions = int(model.config.max_position_embeddings)
        self.device = next(model.parameters()).device
        self.forwards = 0
        self._cache = DynamicCache(config=model.config)
        self._pending = torch.empty(0, dtype=torch.long, device=self.device)  # [Lp]

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        block_length: int | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        attn_implementation: str = "sdpa",
        trust_remote_code: bool = False,
        exact: bool = False,
    ) -> SDARTarget:
        """Load a local SDAR-style checkpoint directory (weights, tokenizer, ids, block size).

        exact: verify in the per-piece layout (the class docstring), whatever `attn_implementation` says."""
        if block_length is not None and block_length < 1:
            raise ValueError(f"block_length must be >= 1, got {block_length}")
        config, info = read_checkpoint(path)
        block_length = info.block_size if block_length is None else block_length
        if block_length != info.block_size:
            warnings.warn(
                f"decode block length {block_length} differs from the checkpoint's block_size {info.block_size} "
                f"({path}); the target was trained for {info.block_size}-token blocks",
                stacklevel=2,
            )
        # Our config, not the directory's model_type (sdar): transformers would warn that it does not know it.
        tokenizer = AutoTokenizer.from_pretrained(str(path), config=config, trust_remote_code=trust_remote_code)
        if tokenizer.convert_ids_to_tokens(info.mask_id) is None:
            raise ValueError(
                f"the tokenizer in {path} has no token for mask_token_id {info.mask_id}; "
                "add the mask token to the tokenizer (SDAR: <|MASK|>)"
            )
        model_class = next(m for c, m in FAMILIES.values() if type(config) is c)
        model = model_class.from_pretrained(str(path), config=config, dtype=dtype, attn_implementation=attn_implementation).to(device)
        return cls(model, info.mask_id, info.eos_ids, block_length, tokenizer=tokenizer, name=str(path), exact=exact)

    # -- the Target protocol ----------------------------------------------------------------------

    def start(self, prefix: torch.Tensor) -> None:
        if prefix.numel() % self.block_length:
            raise ValueError(f"prefix length {prefix.numel()} is not a multiple of the block length {self.block_length}")
        self._cache = DynamicCache(config=self.model.config)
        self._pending = prefix.to(self.device, torch.long)

    def commit(self, block: torch.Tensor) -> None:
        self._pending = torch.cat([self._pending, block.to(self.device, torch.long)])

    @torch.inference_mode()
    def verify(self, pieces: torch.Tensor, start: int) -> torch.Tensor:
        n_pieces, k = pieces.shape  # [P, K]
        cached = self._cache.get_seq_length()
        n_pending = self._pending.numel()
        if cached + n_pending != start:
            raise RuntimeError(f"active block starts at {start} but the cache and pending blocks end at {cached + n_pending}")
        if start + k > self.max_positions:
            raise ValueError(f"block ending at position {start + k} exceeds the model's {self.max_positions} positions")
        input_ids = torch.cat([self._pending, pieces.to(self.device).reshape(-1)])[None]  # [1, Lp + P*K]
        positions = torch.cat(
            [torch.arange(cached, start, device=self.device), torch.arange(start, start + k, device=self.device).repeat(n_pieces)]
        )[None]  # [1, Lp + P*K]
        if self.exact:
            layout = PieceLayout(cached, n_pending, n_pieces, k, self._pending_mask(cached, n_pending))
            attention = {"attention_mask": None, "piece_layout": layout}
        else:
            attention = {"attention_mask": self._mask(cached, n_pending, n_pieces)}  # [1, 1, Lp + P*K, cached + Lp + P*K]
        hidden = self.model.model(
            input_ids=input_ids, position_ids=positions, cache=self._cache, use_cache=True, **attention
        ).last_hidden_state  # [1, Lp + P*K, d]
        logits = self.model.lm_head(hidden[0, n_pending:]).view(n_pieces, k, -1)  # [P, K, V]
        self._cache.crop(-(n_pieces * k))  # keep the completed blocks only
        self._pending = self._pending[:0]
        self.forwards += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # so that callers time the forward, not its launch
        return logits.float()

    def max_pieces(self, context: int) -> int:
        config = self.model.config
        element = next(self.model.parameters()).element_size()
        kv_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * element
        per_position = (
            self.vocab_size * (element + 4)  # logits, and their float32 copy
            + config.num_attention_heads * (context + self.block_length) * 4  # one layer's attention scores (math path)
            + 4 * config.intermediate_size * element  # one layer's MLP activations
            + kv_per_token  # the pieces' keys and values, cached until the crop
        )
        return int(SAFE_FRACTION * self._free_bytes() // (self.block_length * per_position))

    def _free_bytes(self) -> int:
        if self.device.type == "cuda":
            return torch.cuda.mem_get_info(self.device)[0]
        try:
            meminfo = Path("/proc/meminfo").read_text()
            return int(next(line.split()[1] for line in meminfo.splitlines() if line.startswith("MemAvailable:"))) * 1024
        except (OSError, StopIteration):
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")

    def _pending_mask(self, cached: int, n_pending: int) -> torch.Tensor | None:
        """[Lp, cached + Lp]: a pending row sees the cache and the pending rows of its own or an earlier block."""
        if n_pending == 0:
            return None
        block = torch.arange(cached, cached + n_pending, device=self.device) // self.block_length  # [Lp]
        cache_visible = torch.ones(n_pending, cached, dtype=torch.bool, device=self.device)
        return torch.cat([cache_visible, block[None, :] <= block[:, None]], dim=1)

    def _mask(self, cached: int, n_pending: int, n_pieces: int) -> torch.Tensor:
        """[1, 1, Lp + P*K, cached + Lp + P*K], the packed layout: pending rows as `_pending_mask`;
        piece rows see the cache, the whole pending prefix and their own piece, never another piece."""
        n = n_pieces * self.block_length
        piece_id = torch.arange(n_pieces, device=self.device).repeat_interleave(self.block_length)  # [P*K]
        piece_rows = torch.cat(
            [torch.ones(n, cached + n_pending, dtype=torch.bool, device=self.device), piece_id[:, None] == piece_id[None, :]],
            dim=1,
        )  # [P*K, cached + Lp + P*K]
        if n_pending == 0:
            return piece_rows[None, None]
        pending_rows = torch.cat(
            [self._pending_mask(cached, n_pending), torch.zeros(n_pending, n, dtype=torch.bool, device=self.device)], dim=1
        )  # [Lp, cached + Lp + P*K]
        return torch.cat([pending_rows, piece_rows])[None, None]
