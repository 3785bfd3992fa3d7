"""spot_eval: the benchmark harness around `spot`, and everything with I/O.

Subpackages, each a layer that imports only the layers below it (tests/test_layout.py checks it):

    cli.py        the `spot-eval` command; nothing imports it
    harness/      `lm_eval --model spot` and single-prompt decoding
    reports/      results tables, regressions, nightly, compare, rendering
    training/     the embedded target, trajectories, drafter training and calibration
    tracking/     MLflow writing, the outage spool, sync
    checkpoints/  target, drafter and graph files, fingerprints, which files ship
    data/         the vendored benchmark data
    execution/    the sandbox and the code metric

`assets/` holds the shipped files (package data, no code).
"""
