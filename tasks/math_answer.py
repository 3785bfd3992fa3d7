"""Scoring of spot_math500: upstream minerva_math's `exact_match` and `math_verify`, plus a \\boxed{} fallback.

Upstream's exact_match reads the answer only from Minerva's few-shot closing sentence ("Final Answer: The final
answer is X. I hope it is correct."). A zero-shot chat model trained on MATH solutions ends with \\boxed{X}
instead, which upstream scores 0 however right it is. So when that sentence is absent, exact_match grades the
last \\boxed{} of the response, with upstream's normalisation and equivalence; every other case, and
math_verify always, is upstream's own `process_results`.
"""

from __future__ import annotations

from lm_eval.tasks.minerva_math import utils as minerva

# What upstream's get_unnormalized_answer returns when the closing sentence is missing.
_NO_FINAL_ANSWER = "[invalidanswer]"


def process_results(doc: dict, results: list[str]) -> dict[str, int]:
    scores = minerva.process_results(doc, results)
    if minerva.get_unnormalized_answer(results[0]) == _NO_FINAL_ANSWER:
        boxed = last_boxed_answer(results[0])
        if boxed is not None:
            scores["exact_match"] = int(
                minerva.is_equiv(minerva.normalize_final_answer(boxed), doc["answer"])
            )
    return scores


def last_boxed_answer(response: str) -> str | None:
    """The content of the last \\boxed{...} (or `\\boxed X`) of a response, as upstream's process_docs takes
    the gold answer from a solution; None if there is none, or it is unclosed or an \\fbox (which upstream's
    `remove_boxed` would reject with an AssertionError)."""
    boxed = minerva.last_boxed_only_string(response)
    if boxed is None or not boxed.startswith(("\\boxed{", "\\boxed ")):
        return None
    return minerva.remove_boxed(boxed)
