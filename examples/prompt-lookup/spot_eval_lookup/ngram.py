"""The prompt lookup (Saxena, prompt-lookup decoding, https://github.com/apoorvumang/prompt-lookup-decoding): what
the text says next, if it repeats itself.

Answers copy their prompts: a function's name and arguments, a test's literals, a quantity of a word problem. So the
tokens that followed the last place where the text's final few tokens occurred before are a guess at what comes
next, read from the text alone, with no model and no training.
"""

from __future__ import annotations

import torch

# Saxena's max_ngram_size: three tokens already pin a place down, and longer matches are rarely found.
MAX_NGRAM = 3
# Saxena goes down to one token; one repeated token names a place too loosely. In the embedded target's draft-free
# decodes of 12 prompts (items 20 to 22 of MBPP, HumanEval, GSM8K and MATH-500), where a one-token match named
# another token than the stale logits' first choice, it named the target's token 2 times in 180.
MIN_NGRAM = 2


def continuation(context: torch.Tensor, length: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> torch.Tensor | None:
    """[length] int64: the tokens that followed the latest earlier occurrence of the longest n-gram
    (min_ngram <= n <= max_ngram) that ends `context` ([L] int64), or None where none occurs earlier.

    The latest occurrence, not Saxena's earliest: a loop's last iteration, or a name's last mention, is the nearer
    model of what follows (on the embedded target the two drafted alike). The copy may run into the text it
    predicts (an occurrence just before the end), as a repetition does: `a b a b` continues `a b a b ...`.
    """
    tokens = context.tolist()
    size = len(tokens)
    for n in range(min(max_ngram, size - 1), min_ngram - 1, -1):
        earlier = context.unfold(0, n, 1)[:-1]  # [L - n, n]: every n-gram of the context but its own last one
        hits = (earlier == context[-n:]).all(dim=-1).nonzero()
        if len(hits):
            start = int(hits[-1]) + n  # where the latest occurrence's continuation begins (< L)
            for i in range(length):  # tokens[start + i] exists: start < L, and each copied token extends `tokens`
                tokens.append(tokens[start + i])
            return torch.tensor(tokens[size:], dtype=torch.int64)
    return None
