"""`lm_eval --model spot --model_args ...`: one frozen dataclass, `SpotArgs`, generated from the typed settings.

Its fields are the options of `TargetSettings`, `RunSettings`, `DecodeConfig` and `TrackingSettings`, in that
order (spot_eval.harness.options), so a setting added to any of them is a model_arg, parsed and checked, with
no edit here; the model_args reference page is generated from the same options (docs/generate.py).
"""

from __future__ import annotations

import dataclasses

from spot.config import DecodeConfig
from spot_eval.harness.options import Option, build, options, parse
from spot_eval.harness.settings import RunSettings, TargetSettings, TrackingSettings, as_bool, as_float

# LLaDA generate.py's own options that spot-eval does not run: (the value that changes nothing, why not). At that
# value each is taken and dropped (a line copied from LLaDA's settings still runs); at any other it is refused.
NOT_RUN = {
    "cfg_scale": (0.0, "LLaDA's classifier-free guidance, which spot-eval does not run (every step would need a "
                       "second forward with the prompt masked out)"),
    "logits_eos_inf": (False, "LLaDA's ban of the EOS token from every step, which spot-eval does not run"),
    "confidence_eos_eot_inf": (False, "LLaDA's exclusion of EOS and EoT from the confidences, which spot-eval does not run"),
}

# The model_args in groups, as the reference page shows them.
GROUPS = (("The target", TargetSettings), ("The methods", RunSettings), ("The decoder", DecodeConfig),
          ("Tracking", TrackingSettings))


def spot_args_class(decoder: type = DecodeConfig) -> type:
    """SpotArgs for a decoder config class (the project's `DecodeConfig`; a test passes one with a field more)."""
    groups = tuple(decoder if cls is DecodeConfig else cls for _, cls in GROUPS)
    opts = tuple(o for cls in groups for o in options(cls))
    by_class = {cls: options(cls) for cls in groups}

    def parse_args(cls, kwargs: dict) -> SpotArgs:
        """Typed values from lm-eval's model_args (strings, or numbers lm-eval coerced), each checked by name."""
        return cls(**parse(opts, {k: v for k, v in kwargs.items() if not not_run(k, v)}))

    def decode_config(self, block_length: int) -> DecodeConfig:
        """The decoder settings, validated (spot.config names any bad one), at the block length the checkpoint gives
        where block_length is unset."""
        values = dataclasses.asdict(self)
        return build(groups[2], values, by_class[groups[2]], block_length=block_length)

    def part(self, cls: type) -> object:
        """The settings of one typed class (TargetSettings, RunSettings, TrackingSettings) among these."""
        return build(cls, dataclasses.asdict(self), by_class[cls])

    fields = [(o.name, o.kind | None if o.optional else o.kind, dataclasses.field(default=o.default)) for o in opts]
    cls = dataclasses.make_dataclass(
        "SpotArgs", fields, frozen=True,
        namespace={"__doc__": "The `--model_args` of `lm_eval --model spot` (generated: spot_eval.harness.model_args).",
                   "OPTIONS": opts, "parse": classmethod(parse_args), "decode_config": decode_config, "part": part},
    )
    cls.__module__ = __name__
    return cls


SpotArgs = spot_args_class()
OPTIONS: tuple[Option, ...] = SpotArgs.OPTIONS


def not_run(name: str, value: object) -> bool:
    """True for one of NOT_RUN's options at the value that changes nothing (to drop); refused at any other."""
    if name not in NOT_RUN:
        return False
    neutral, why = NOT_RUN[name]
    given = as_bool(name, value) if isinstance(neutral, bool) else as_float(name, value)
    if given != neutral:
        raise ValueError(f"{name}={value}: {why}; drop {name} (LLaDA's default, {str(neutral).lower()}, is what "
                         "spot-eval decodes)")
    return True
