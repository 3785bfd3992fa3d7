"""spot_eval: the benchmark harness around `spot` (CLI, lm-eval model, tasks, tracking, reports)."""
