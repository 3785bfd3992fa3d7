"""Drafters: propose candidate future block states for the engine to verify."""

from spot.drafters.base import DraftContext, Drafter
from spot.drafters.reference import AdversarialDrafter, OracleDrafter, RandomDrafter

__all__ = ["AdversarialDrafter", "DraftContext", "Drafter", "OracleDrafter", "RandomDrafter"]
