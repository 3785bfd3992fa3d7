"""Train the project's embedded target: a tiny SDAR-architecture block-diffusion LM and its tokenizer.

The target is a plain `Qwen3ForCausalLM` trained with the SDAR / BD3-LM block-diffusion objective,
so `spot.targets.BlockCausalTarget` decodes it exactly as it decodes a real SDAR checkpoint: the logits at
a block position predict the token at that same position (no shift), with clean earlier blocks
visible and bidirectional attention inside the block.

One training sequence is a chat-formatted pair, padded with <|endoftext|> to a whole number of
blocks (the decoder stops at the first <|im_end|> / <|endoftext|>, so the model must learn to fill
the rest of its last block with EOS):

    <|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n{answer}<|im_end|><|endoftext|>...

Each step masks a fraction t ~ U(0, 1) (drawn per sequence and block) of the answer positions of
every block; prompt positions are never masked, as in a decode whose first block holds the tail of
the prompt. The forward uses BD3-LM's "2L" layout: input [x_t | x_0], positions [0..L-1, 0..L-1],
and a block-diffusion mask (`block_diffusion_mask`); the loss is cross-entropy on the masked
positions of the x_t half. The block length is drawn per batch from {16, 32}, so one checkpoint
serves both.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

EOT, IM_START, IM_END, MASK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"
SPECIAL_TOKENS = (EOT, IM_START, IM_END, MASK)  # ids 0..3, in this order
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen2's pre-tokenizer split: digits stand alone (arithmetic needs them), words keep a leading space.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class ModelSize:
    """The Qwen3 decoder's shape; the vocabulary comes from the tokenizer."""

    hidden: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    intermediate: int = 768
    max_positions: int = 2048
    rope_theta: float = 10000.0


@dataclass(frozen=True)
class TrainConfig:
    """Everything that fixes the trained weights (with the pairs); `minutes` is only a safety cap."""

    seed: int = 0
    steps: int = 2300
    batch_tokens: int = 4096  # sequence positions per batch (x_0 half), batch padding included
    lr: float = 3e-3
    warmup: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    block_lengths: tuple[int, ...] = (16, 32)  # drawn per batch
    block_size: int = 32  # the block length the checkpoint declares
    max_tokens: int = 512  # longer sequences lose the end of their answer
    vocab_size: int = 6144
    heldout_fraction: float = 0.02
    eval_every: int = 200
    log_every: int = 10
    minutes: float | None = None
    device: str = "cpu"
    threads: int | None = None
    bf16: bool = True  # autocast matmuls to bfloat16 (weights stay fp32): about 1.7x faster on CPU
    model: ModelSize = field(default_factory=ModelSize)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if any(self.max_tokens % k for k in self.block_lengths) or self.block_size not in self.block_lengths:
            raise ValueError(
                f"max_tokens {self.max_tokens} must be a multiple of each block length {self.block_lengths}, "
                f"and block_size {self.block_size} one of them"
            )
        if self.batch_tokens < self.max_tokens:
            raise ValueError(f"batch_tokens {self.batch_tokens} must be >= max_tokens {self.max_tokens}")


@dataclass(frozen=True)
class Example:
    """One encoded pair: the chat-formatted prompt, then the answer and <|im_end|> (maybe truncated)."""

    ids: tuple[int, ...]
    n_prompt: int  # leading tokens that are never masked


@dataclass(frozen=True)
class Batch:
    """x0: [B, L] clean tokens, EOS-filled to whole blocks and padded to the longest; L % block == 0."""

    x0: torch.Tensor
    n_prompt: torch.Tensor  # [B]
    n_real: torch.Tensor  # [B] positions up to the end of the last block; the rest is batch padding


# -- tokenizer ---------------------------------------------------------------------------------------


def train_tokenizer(texts: Sequence[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE over `texts` with the chat template and SDAR's special tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=IM_END, pad_token=EOT, mask_token=MASK, chat_template=CHAT_TEMPLATE
    )
    if tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS)) != [0, 1, 2, 3]:
        raise RuntimeError("the special tokens did not get ids 0..3")
    return tokenizer


def encode(tokenizer: PreTrainedTokenizerFast, pairs: Sequence, max_tokens: int) -> list[Example]:
    """Chat-format and tokenize pairs; the prompt is tokenized alone, exactly as at decode time.

    Pairs whose prompt leaves less than an eighth of max_tokens for the answer are dropped.
    """
    chats = [[{"role": "user", "content": p.prompt}] for p in pairs]
    prompts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer([p.answer + IM_END for p in pairs], add_special_tokens=False)["input_ids"]
    return [
        Example(ids=tuple((q + a)[:max_tokens]), n_prompt=len(q))
        for q, a in zip(prompt_ids, answer_ids, strict=True)
        if len(q) <= max_tokens * 7 // 8
    ]


def is_heldout(pair, fraction: float) -> bool:
    """A pair's split depends only on its text, so every seed holds out the same pairs."""
    digest = hashlib.sha256(f"{pair.source}\n{pair.prompt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


# -- the block-diffusion objective -----------------------------------------------------------------


def block_diffusion_mask(length: int, block: int) -> torch.Tensor:
    """BD3-LM's 2L attention mask (True = attend) for the input [x_t | x_0] of 2 * length tokens.

    x_t block b sees x_t block b (bidirectional) and x_0 blocks < b; x_0 block b sees x_0 blocks <= b.
    Returns: [2L, 2L] bool.
    """
    blocks = torch.arange(length).div(block, rounding_mode="floor").repeat(2)  # [2L]
    clean = torch.arange(2 * length) >= length  # [2L], True on the x_0 half
    q_block, k_block = blocks[:, None], blocks[None, :]
    q_clean, k_clean = clean[:, None], clean[None, :]
    noisy_to_noisy = ~q_clean & ~k_clean & (k_block == q_block)
    noisy_to_clean = ~q_clean & k_clean & (k_block < q_block)
    clean_to_clean = q_clean & k_clean & (k_block <= q_block)
    return noisy_to_noisy | noisy_to_clean | clean_to_clean


def make_batch(examples: Sequence[Example], block: int) -> Batch:
    """EOS-fill each sequence to whole blocks, then pad the batch to its longest sequence."""
    eot = SPECIAL_TOKENS.index(EOT)
    n_real = [math.ceil(len(e.ids) / block) * block for e in examples]
    x0 = torch.full((len(examples), max(n_real)), eot, dtype=torch.long)  # <|endoftext|> fills and pads
    for row, e in enumerate(examples):
        x0[row, : len(e.ids)] = torch.tensor(e.ids)
    return Batch(x0=x0, n_prompt=torch.tensor([e.n_prompt for e in examples]), n_real=torch.tensor(n_real))


def mask_answers(batch: Batch, block: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask each answer position with probability t, t ~ U(0, 1) drawn per sequence and block.

    Returns: x_t [B, L] (masked positions hold <|MASK|>) and `masked` [B, L] bool. Prompt and
    batch-padding positions are never masked.
    """
    n, length = batch.x0.shape
    pos = torch.arange(length)[None, :]  # [1, L]
    answer = (pos >= batch.n_prompt[:, None]) & (pos < batch.n_real[:, None])  # [B, L]
    t = torch.rand(n, length // block, generator=generator).repeat_interleave(block, dim=1)  # [B, L]
    masked = answer & (torch.rand(n, length, generator=generator) < t)
    return batch.x0.masked_fill(masked, SPECIAL_TOKENS.index(MASK)), masked


def diffusion_loss(
    model: Qwen3ForCausalLM, x0: torch.Tensor, xt: torch.Tensor, masked: torch.Tensor, block: int
) -> tuple[torch.Tensor, int]:
    """Summed cross-entropy over the masked positions of x_t, and their count.

    Batch padding needs no attention mask of its own: it fills whole blocks after every real
    block, and the block-causal mask already hides later blocks from earlier ones.
    """
    n, length = x0.shape
    ids = torch.cat([xt, x0], dim=1)  # [B, 2L]
    positions = torch.arange(length, device=x0.device).repeat(2)[None].expand(n, -1)  # [B, 2L]
    mask = block_diffusion_mask(length, block).to(x0.device).expand(n, 1, -1, -1)  # [B, 1, 2L, 2L]
    out = model.model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=False)
    hidden = out.last_hidden_state  # [B, 2L, d]
    logits = model.lm_head(hidden[:, :length][masked])  # [M, V], the masked x_t positions only
    return F.cross_entropy(logits.float(), x0[masked], reduction="sum"), int(masked.sum())


# -- training ----------------------------------------------------------------------------------------


def batch_plan(lengths: Sequence[int], batch_tokens: int, rng: random.Random) -> Iterator[list[int]]:
    """Endless epochs of shuffled batches of similar-length examples (little padding).

    `lengths` are already rounded up to whole blocks; a batch holds at most batch_tokens positions.
    """
    while True:
        order = list(range(len(lengths)))
        rng.shuffle(order)
        batches: list[list[int]] = []
        for lo in range(0, len(order), 512):
            current: list[int] = []
            for i in sorted(order[lo : lo + 512], key=lengths.__getitem__):
                if current and (len(current) + 1) * lengths[i] > batch_tokens:
                    batches.append(current)
                    current = []
                current.append(i)
            batches.append(current)
        rng.shuffle(batches)
        yield from batches


def build_model(size: ModelSize, vocab_size: int) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        head_dim=size.head_dim,
        max_position_embeddings=size.max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": size.rope_theta},
        tie_word_embeddings=True,  # saves vocab x hidden parameters: a quarter of the checkpoint
        bos_token_id=None,
        eos_token_id=SPECIAL_TOKENS.index(IM_END),
        pad_token_id=SPECIAL_TOKENS.index(EOT),
        attn_implementation="sdpa",
    )
    return Qwen3ForCausalLM(config)


def learning_rate(config: TrainConfig, step: int) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio * lr at the last step."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(config.steps - config.warmup, 1)
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * cosine)


@torch.no_grad()
def heldout_loss(
    model: Qwen3ForCausalLM, examples: Sequence[Example], block: int, config: TrainConfig
) -> float | None:
    """Mean masked cross-entropy with a fixed masking seed, so values compare across steps and runs."""
    if not examples:
        return None
    model.eval()
    generator = torch.Generator().manual_seed(1234)
    total, count = 0.0, 0
    ordered = sorted(examples, key=lambda e: len(e.ids))
    for lo in range(0, len(ordered), 8):
        batch = make_batch(ordered[lo : lo + 8], block)
        xt, masked = mask_answers(batch, block, generator)
        with _autocast(config):
            loss, n = diffusion_loss(model, *(t.to(config.device) for t in (batch.x0, xt, masked)), block)
        total, count = total + float(loss), count + n
    model.train()
    return total / max(count, 1)


def save_target(
    model: Qwen3ForCausalLM, tokenizer: PreTrainedTokenizerFast, out: Path, block_size: int
) -> None:
    """A standard transformers directory plus SDAR's `block_size` and `mask_token_id` fields."""
    model.config.block_size = block_size
    model.config.mask_token_id = SPECIAL_TOKENS.index(MASK)
    model.generation_config = GenerationConfig(
        eos_token_id=[SPECIAL_TOKENS.index(IM_END), SPECIAL_TOKENS.index(EOT)],
        pad_token_id=SPECIAL_TOKENS.index(EOT),
    )
    model.cpu().save_pretrained(out)
    tokenizer.save_pretrained(out, save_jinja_files=False)  # the chat template stays in tokenizer_config.json


def _autocast(config: TrainConfig) -> torch.autocast:
    return torch.autocast(torch.device(config.device).type, dtype=torch.bfloat16, enabled=config.bf16)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def train(config: TrainConfig, pairs: Sequence, out: str | Path) -> dict:
    """Train tokenizer and model on `pairs` (objects with source, prompt, answer), save both to `out`.

    Returns the training log (also written to out/training_log.json).
    """
    t0 = time.perf_counter()
    if config.threads:
        torch.set_num_threads(config.threads)
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    out = Path(out)

    heldout_pairs = [p for p in pairs if is_heldout(p, config.heldout_fraction)]
    train_pairs = [p for p in pairs if not is_heldout(p, config.heldout_fraction)]
    tokenizer = train_tokenizer([f"{p.prompt}\n{p.answer}" for p in train_pairs], config.vocab_size)
    train_set = encode(tokenizer, train_pairs, config.max_tokens)
    heldout = encode(tokenizer, heldout_pairs, config.max_tokens)
    if not train_set:
        raise ValueError(f"no training sequences: all {len(train_pairs)} prompts are too long for max_tokens")
    _progress(
        f"tokenizer: {len(tokenizer)} tokens; {len(train_set)} training / {len(heldout)} held-out sequences, "
        f"{sum(len(e.ids) for e in train_set)} training tokens ({time.perf_counter() - t0:.0f} s)"
    )

    model = build_model(config.model, len(tokenizer)).to(config.device).train()
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
        betas=(0.9, 0.95),
        fused=True,  # the unfused CPU AdamW costs about as much as the forward of this small model
    )
    longest = max(config.block_lengths)
    lengths = [math.ceil(len(e.ids) / longest) * longest for e in train_set]
    plan = batch_plan(lengths, config.batch_tokens, rng)

    curve: list[dict] = []
    evals: list[dict] = []
    window_loss, window_count, window_positions, window_t = 0.0, 0, 0, time.perf_counter()
    tokens_seen, stopped_early, step = 0, False, 0
    t_train = time.perf_counter()
    for step in range(config.steps):
        block = rng.choice(config.block_lengths)
        batch = make_batch([train_set[i] for i in next(plan)], block)
        xt, masked = mask_answers(batch, block, generator)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(config, step)
        with _autocast(config):
            tensors = (t.to(config.device) for t in (batch.x0, xt, masked))
            loss_sum, count = diffusion_loss(model, *tensors, block)
        (loss_sum / max(count, 1)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        tokens_seen += batch.x0.numel()
        window_loss += loss_sum.item()
        window_count += count
        window_positions += batch.x0.numel()
        out_of_time = config.minutes is not None and time.perf_counter() - t0 > 60 * config.minutes
        if (step + 1) % config.log_every == 0 or step + 1 == config.steps or out_of_time:
            seconds = time.perf_counter() - window_t
            entry = {"step": step + 1, "loss": window_loss / max(window_count, 1)}
            entry["lr"] = learning_rate(config, step)
            curve.append(entry)
            _progress(
                f"step {step + 1}/{config.steps}  loss {entry['loss']:.3f}  lr {entry['lr']:.2e}  "
                f"{window_positions / seconds:.0f} tok/s  {time.perf_counter() - t0:.0f} s"
            )
            window_loss, window_count, window_positions, window_t = 0.0, 0, 0, time.perf_counter()
        if out_of_time:
            stopped_early = step + 1 < config.steps
            break
        if (step + 1) % config.eval_every == 0 and step + 1 < config.steps:
            loss = heldout_loss(model, heldout, config.block_size, config)
            evals.append({"step": step + 1, "heldout_loss": loss})
            _progress(f"step {step + 1}  held-out loss {evals[-1]['heldout_loss']}")
    steps_done = step + 1
    train_seconds = time.perf_counter() - t_train

    final = {f"heldout_loss_block{k}": heldout_loss(model, heldout, k, config) for k in config.block_lengths}
    evals.append({"step": steps_done, "heldout_loss": final[f"heldout_loss_block{config.block_size}"]})
    _progress(f"final held-out loss {final}")
    save_target(model, tokenizer, out, config.block_size)
    log = {
        "config": asdict(config),
        "parameters": n_params,
        "vocab_size": len(tokenizer),
        "train_sequences": len(train_set),
        "heldout_sequences": len(heldout),
        "steps": steps_done,
        "stopped_early": stopped_early,
        "tokens_seen": tokens_seen,
        "train_seconds": train_seconds,
        "wall_seconds": time.perf_counter() - t0,
        "curve": curve,
        "heldout": evals,
        **final,
    }
    (out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    return log
