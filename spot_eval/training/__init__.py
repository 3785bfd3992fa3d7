"""Training pipelines: the embedded target, trajectories, and the drafters built from them.

- `train_target.py`: `spot-eval train-target`, the embedded target and its tokenizer.
- `corpus.py`: training prompts from training splits only (no test item leaks in).
- `collect.py`, `trajectories.py`: `spot-eval collect`, draft-free trajectories as shards.
- `train_drafter.py`: `spot-eval train-drafter`, SPOT's order model.
- `fit_gamma.py`: `spot-eval fit-gamma`, SPOT-gamma's per-depth exponents.
- `spiffy_calibrate.py`: `spot-eval spiffy-calibrate`, Spiffy's draft graph.

May import checkpoints and data; never the harness, reports, tracking or the CLI.
"""
