"""The verify-cost profile of (device, target, dtype, block length, layout): measured once, then cached.

budget=auto (spot.sizing) sizes trees by c(P, L), the seconds of one verify forward with P pieces
after L positions, on the device at hand. `verify_profile` returns the cached profile when its key
matches, and otherwise measures it (spot.cost: a bounded probe, about 2 s on this project's CPU for
the embedded target) with a one-line notice and caches it as JSON under
`$XDG_CACHE_HOME/spot-eval/profiles/` (`~/.cache` when unset). A profile of another device, target
(weights digest), dtype, block length, attention layout, thread count or profile version is never
reused: its key differs, so its file name differs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from collections import deque
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from spot.config import DecodeConfig
from spot.cost import measure_drafter, measure_verify, probe_contexts
from spot.engine import DecodeStats
from spot.sizing import DraftMode, Sizing, VerifyCost, refit
from spot_eval.checkpoints.atomic_file import write_atomically
from spot_eval.checkpoints.fingerprint import weights_digest

VERSION = 2  # bump when the probe changes what it measures (2: timed between the steps decoding runs)
log = logging.getLogger("spot_eval")


@dataclass(frozen=True)
class ProfileKey:
    device: str  # e.g. "cuda: NVIDIA H200" or "cpu: <processor>, 2 threads"
    target: str  # the weights digest (spot_eval.checkpoints.fingerprint)
    dtype: str
    block_length: int
    exact: bool
    cache: str | None = None  # a bidirectional target's frozen-cache decoder (spot.targets.dual_cache)
    version: int = VERSION

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Profile:
    key: ProfileKey
    verify: VerifyCost
    measured_at: str  # UTC, ISO 8601
    probe_seconds: float  # what the measurement took

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(raw: dict) -> Profile:
        v = raw["verify"]
        verify = VerifyCost(tuple(v["pieces"]), tuple(v["contexts"]), tuple(tuple(r) for r in v["seconds"]))
        return Profile(ProfileKey(**raw["key"]), verify, raw["measured_at"], float(raw["probe_seconds"]))


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spot-eval" / "profiles"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return f"{device.type}: {_processor()}, {torch.get_num_threads()} threads"


def _processor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def profile_key(target) -> ProfileKey:
    """The key of a target loaded from a model directory (its `name`)."""
    return ProfileKey(device_name(target.device), weights_digest(Path(target.name)),
                      str(target.model.dtype).removeprefix("torch."), target.block_length, bool(target.exact),
                      getattr(target, "cache", None))


def verify_profile(target, remeasure: bool = False) -> Profile:
    """The cached profile of this target on this device, or a fresh measurement (then cached)."""
    key = profile_key(target)
    path = cache_dir() / f"{key.digest()}.json"
    if path.is_file() and not remeasure:
        try:
            profile = Profile.from_dict(json.loads(path.read_text()))
            if profile.key == key:
                return profile
        except (ValueError, KeyError, TypeError) as err:
            log.warning("the verify-cost profile %s is unreadable (%s); measuring again", path, err)
    log.warning("spot-eval: measuring the verify cost of %s on %s for budget=auto (once; cached in %s)",
                Path(target.name).name, key.device, path.parent)
    started = time.perf_counter()
    verify = measure_verify(target, probe_contexts(target))
    profile = Profile(key, verify, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), time.perf_counter() - started)
    try:
        write_atomically(path, lambda tmp: tmp.write_text(json.dumps(profile.to_dict(), indent=1)))
    except OSError as err:  # an unwritable cache costs a re-measurement next time, nothing more
        log.warning("spot-eval: cannot cache the verify-cost profile in %s (%s)", path.parent, err)
    return profile


def auto_sizing(target, drafter, config: DecodeConfig, profile: Profile | None = None) -> Sizing:
    """What budget=auto decides with for one drafter at `config` (its budget the cap): the device's
    profile (cached or measured) and, for each of the drafter's calibrated modes (`drafter.modes`),
    its seconds per tree at budgets 1, 4 and the cap (measured now, a few calls each) and its mean
    reach by best-first rank."""
    profile = profile or verify_profile(target)
    budgets = sorted({min(b, config.budget) for b in (1, 4, config.budget)})
    modes = tuple(
        DraftMode(name, tuple((b, measure_drafter(drafter, target, replace(config, budget=b), name)) for b in budgets), mean_reach)
        for name, mean_reach in drafter.modes.items()
    )
    return Sizing(profile.verify, modes)


def drafter_seconds(sizing: Sizing) -> dict[str, dict[int, float]]:
    """The measured seconds per tree, by mode and budget (what run.json and `decode` report)."""
    return {mode.name: dict(mode.seconds) for mode in sizing.modes}


class Refitted:
    """budget=auto's sizing of one method across requests: the probe's (`auto_sizing`), refitted after
    each request to the verify forwards and drafts of the last WINDOW forwards decoding measured
    (spot.sizing.refit), so that a request decides with fixed inputs and the next with better ones."""

    WINDOW = 4096

    def __init__(self, probed: Sizing) -> None:
        self.probed = probed
        self.sizing = probed
        self._timings: deque = deque(maxlen=self.WINDOW)

    def observe(self, stats: DecodeStats) -> None:
        self._timings.extend(stats.timings)
        self.sizing = refit(self.probed, list(self._timings))
