"""How a speculative method is described: the record that the harness parses `methods=` against, builds drafters
from, and that the reports, `spot-eval methods` and the docs read its name, colour and costs from.

Built-in methods (spot_eval.families) and plugins (spot_eval.registry) are described alike; a plugin author reaches
this module through spot_eval.plugin, whose version covers it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING

from spot.config import ACCEPTANCES

if TYPE_CHECKING:  # a drafter is built after the command line has parsed its flags, which must not wait for torch
    from spot.drafters.base import Drafter

NAME = re.compile(r"^[a-z][a-z0-9_]*$")  # what `methods=name@budget` can spell (lower case: labels are case-blind)
COLOUR = re.compile(r"^#[0-9A-Fa-f]{6}$")
# Paul Tol's "muted" scheme (distinct under colour-vision deficiencies, and from the built-ins' Okabe-Ito colours): a
# method that names no colour takes one of these by its name, so every plugin keeps one colour in every figure.
SPARE_COLOURS = ("#332288", "#88CCEE", "#44AA99", "#117733", "#999933", "#DDCC77", "#CC6677", "#882255", "#AA4499")


class PluginError(RuntimeError):
    """A plugin's method failed where the harness called it (its build, or its drafter during a decode): not the
    user's input, so never reported as such (`spot-eval decode` exits 1, not 2; lm_eval reports the method failed)."""


class PluginWarning(UserWarning):
    """A plugin that was found and not loaded: it does not import, or a name it declares is taken."""


@dataclass(frozen=True)
class Declared:
    """What one entry point of an installed package declares: its name, the package ("name version"), the objects it
    loaded to (one, or each of a list), or the exception that kept it from loading."""

    point: str
    package: str
    items: tuple[object, ...] = ()
    error: Exception | None = None


def declared(group: str) -> Iterator[Declared]:
    """Every entry point of `group` that an installed package declares (spot_eval.methods, spot_eval.targets), loaded;
    one that does not import comes with its exception, for a line that names it, and the rest still load."""
    for point in entry_points(group=group):
        package = f"{point.dist.name} {point.dist.version}" if point.dist is not None else point.value
        try:
            loaded = point.load()
        except Exception as err:
            yield Declared(point.name, package, error=err)
            continue
        yield Declared(point.name, package, tuple(loaded) if isinstance(loaded, (list, tuple)) else (loaded,))


@dataclass(frozen=True)
class FileKind:
    """One kind of file a learned method reads, told by its first bytes (torch.save writes a zip archive).

    magic: how the file starts (b"{" also matches after leading white space). what: the kind in words. suffix: its
    usual file suffix. command: the command that makes it (a spot-eval subcommand's name, or the plugin's own)."""

    magic: bytes
    what: str
    suffix: str
    command: str

    def matches(self, head: bytes) -> bool:
        """Whether `head` (a file's first bytes, `file_head`) starts a file of this kind."""
        return (head.lstrip() if self.magic == b"{" else head).startswith(self.magic)


def file_head(path: Path) -> bytes:
    """The first bytes of a file, enough for `FileKind.matches` (a drafter file may be tens of MB)."""
    with path.open("rb") as f:
        return f.read(16)


@dataclass(frozen=True)
class Build:
    """What a drafter is built from, once per run and method (per request for `needs_reference`).

    target: the loaded target (spot.targets.base.LoadedTarget: its block_length, vocab_size, mask_id, device,
        tokenizer, model). policy: the decoder's policy. budget: the method's budget (with budget=auto, its cap).
    auto: budget=auto. path: the method's file (None for a method that reads none). reference: the request's
    draft-free Generation, for `needs_reference` (the oracle). threshold: the decoder's threshold.
    """

    target: object
    policy: str
    budget: int
    auto: bool
    path: Path | None
    reference: object = None
    threshold: float | None = None


@dataclass(frozen=True)
class Method:
    """One speculative method, as `methods=name@N` names it.

    name: lower case, `[a-z][a-z0-9_]*`. build: Build -> its drafter (spot.drafters.base.Drafter). display: its
    name in tables and legends (default: `name`). colour: its bars and lines, `#RRGGBB` (default: one of
    SPARE_COLOURS by its name). files: the kinds of file it reads (none: training-free); `methods=name:PATH` passes
    one. auto: its trees carry calibrated reach and its drafter `modes`, so budget=auto can size them. acceptance:
    "exact" (lossless) or "max_commit" (lossy, opt-in, spot.acceptance). needs_reference: it reads the request's
    draft-free decode (a bound, not a method: the oracle). hatch: a matplotlib hatch for a variant beside its
    family. cost: what a new target costs it, in a sentence (the docs' cost table, `spot-eval methods`). reads:
    what its drafter reads of each step, in words (default: said by `files`).
    """

    name: str
    build: Callable[[Build], Drafter] | None
    display: str = ""
    colour: str = ""
    files: tuple[FileKind, ...] = ()
    auto: bool = False
    acceptance: str = "exact"
    needs_reference: bool = False
    hatch: str = ""
    cost: str = ""
    reads: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME.match(self.name):
            raise ValueError(f"method name {self.name!r}: use lower-case letters, digits and _ (starting with a letter)")
        if self.build is not None and not callable(self.build):
            raise ValueError(f"method {self.name}: build must be a function of spot_eval.plugin.Build, got {type(self.build).__name__}")
        if self.colour and not COLOUR.match(self.colour):
            raise ValueError(f"method {self.name}: colour {self.colour!r} is not #RRGGBB")
        if self.acceptance not in ACCEPTANCES:
            raise ValueError(f"method {self.name}: acceptance {self.acceptance!r}; choose from {', '.join(ACCEPTANCES)}")
        if not all(isinstance(kind, FileKind) for kind in self.files):
            raise ValueError(f"method {self.name}: files must be spot_eval.plugin.FileKind values")
        if not self.display:
            object.__setattr__(self, "display", self.name)
        if not self.colour:
            object.__setattr__(self, "colour", SPARE_COLOURS[sum(self.name.encode()) % len(SPARE_COLOURS)])

    @property
    def lossy(self) -> bool:
        return self.acceptance != "exact"

    @property
    def learned(self) -> bool:
        return bool(self.files)

    @property
    def what_it_reads(self) -> str:
        """`reads`, else the files it reads, else that it reads none."""
        if self.reads:
            return self.reads
        return " or ".join(kind.what for kind in self.files) if self.files else "no file: the target's own outputs"
