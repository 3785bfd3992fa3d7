"""The harness behind `lm_eval --model spot`, and single-prompt decoding.

- `lm.py`: the lm-eval `LM` (`SpotLM`) and its typed model_args (`SpotArgs`).
- `registration.py`: registering `spot` with lm-eval at start-up (lm-eval 0.4.13 has no plugin discovery).
- `session.py`: one run's per-request records, run directory and MLflow logging.
- `lossless.py`: each method's tokens against draft-free, and the margin at a divergence.
- `rescore.py`: a lossy method's own texts scored with lm-eval's task, beside the draft-free text.
- `methods.py`: method items (`spot@8`, `spiffy@3:graph.json`) parsed, and their drafters built.
- `decode.py`: `spot-eval decode`, one prompt with one method.

The top layer beside the CLI: it may import reports, training, tracking, checkpoints, data and
execution; nothing imports it but the CLI (and lm-eval, through the entry point).
"""
