"""spot-eval-prompt-lookup: prompt-lookup drafting (Saxena) as a spot-eval method plugin, `methods=lookup@8`.

The package declares `LOOKUP` under the `spot_eval.methods` entry-point group (pyproject.toml), and imports
nothing of spot-eval's but `spot_eval.plugin`: it is the plugin contract's worked example of a packaged method.
"""

from __future__ import annotations

from spot_eval.plugin import Method
from spot_eval_lookup.drafter import LookupDrafter

LOOKUP = Method(
    "lookup", lambda build: LookupDrafter(), display="Prompt lookup", colour="#EE3377",
    cost="nothing: it drafts from the prompt's own text",
    reads="the text before the block and the target's last logits",
)

__all__ = ["LOOKUP", "LookupDrafter"]
