"""Results read back as tables, and the reports built from them.

- `results.py`: run directories and nightly bundles as pandas tables (`Bundle`).
- `history.py`: evaluation runs and nightly series read back from MLflow.
- `regression.py`: what counts as a regression (pure functions over two bundles).
- `nightly.py`: `spot-eval nightly`, a suite run through lm-eval, compared, reported and gated.
- `compare.py`: `spot-eval compare`, the SPOT-vs-Spiffy tables.
- `report.py`, `plots.py`: markdown / self-contained HTML and the figures.
- `suites/`: the default nightly suite.

May import tracking and checkpoints; never the harness (a nightly runs the harness as an
`lm_eval` subprocess) and never the CLI.
"""
