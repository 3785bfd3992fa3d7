"""The plugin API: everything a method or target from outside this repository uses, importable from here alone.

    from spot_eval.plugin import Build, DraftContext, DraftTree, Method

A method plugin describes each method with a `Method` whose `build(Build) -> drafter` makes its drafter: an object
with a `name` and `draft(ctx: DraftContext) -> DraftTree`, and optionally `draft_batch(ctxs) -> list[DraftTree]`
(several requests' trees in one call, each the one `draft` gives) and `modes` (the calibrated reach that budget=auto
sizes trees by, with trees that carry `reach`). An installed package declares its methods under the
`spot_eval.methods` entry-point group; an unpackaged file or module is named on the command line
(`plugins=FILE` in lm_eval's model_args, `--plugins FILE` for spot-eval). `check_method` proves a method lossless
and well-behaved on the embedded target (`spot-eval check-method`). docs/plugins.md has a worked example.

A target plugin declares a `ModelType` (a config.json model_type, the transformers classes that hold its weights,
and optionally its own reference generate function) under the `spot_eval.targets` entry-point group;
`check_target` checks the invariants the engine relies on (`spot-eval check-target`).

Stability: API_VERSION is MAJOR.MINOR. Every name in `__all__`, and the fields and methods their docstrings
document, keep their meaning within a major version; a minor version only adds (a field with a default, a
function). Anything imported from elsewhere in spot or spot_eval is internal and may change in any release.
Whatever a drafter does, the engine keeps the output the draft-free decoder's: it hands a drafter its own copies,
checks every tree (`tree_defect`) before it reads it, and stops a method whose drafter breaks the contract with a
`DraftError` naming it.
"""

from __future__ import annotations

from spot.config import DecodeConfig, Sampling
from spot.drafters.base import DraftContext, Drafter, DraftError
from spot.noise import gumbel_at
from spot.policy import Proposal, decide
from spot.targets.checkpoint import Family as TargetFamily
from spot.tree import DraftTree, Edge, Frontier, SetEdge, grow_best_first
from spot.tree import defect as tree_defect
from spot_eval.checkpoints.model_types import ModelType
from spot_eval.harness.conformance import MethodReport, check_method
from spot_eval.harness.target_check import TargetReport, check_target
from spot_eval.method import Build, FileKind, Method, PluginError

API_VERSION = "1.0"

__all__ = [
    "API_VERSION",
    "Build",
    "DecodeConfig",
    "DraftContext",
    "DraftError",
    "DraftTree",
    "Drafter",
    "Edge",
    "FileKind",
    "Frontier",
    "Method",
    "MethodReport",
    "ModelType",
    "PluginError",
    "Proposal",
    "Sampling",
    "SetEdge",
    "TargetFamily",
    "TargetReport",
    "check_method",
    "check_target",
    "decide",
    "grow_best_first",
    "gumbel_at",
    "tree_defect",
]
