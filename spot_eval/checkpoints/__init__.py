"""Files a run loads, and the identity that ties them together.

- `target.py`: loading a target checkpoint directory and encoding prompts for it.
- `fingerprint.py`: the fingerprint of (target weights, tokenizer, block length, policy) that
  trajectories, drafters and graphs carry, and the check that they match the target in use.
- `drafter.py`: SPOT's order-model checkpoint format (weights_only, sha256-verified).
- `spiffy_graph.py`: Spiffy's calibrated draft graph as a JSON file.
- `shipped.py`: which shipped file (under `spot_eval/assets/`) serves which target and block length.

The bottom layer of spot_eval: it imports `spot` and nothing else of spot_eval.
"""
