"""A lossy method's own outputs scored as lm-eval scores the draft-free text: the task's filters, then its metrics.

lm-eval scores the one text `lm_eval --model spot` returns per request, the draft-free one; a lossless
method's tokens equal it, so its accuracy is the same. A lossy method (max-commit) writes other text, so
after lm-eval's evaluation its texts go through the same task objects (`Task._filters`, each a
FilterEnsemble, then `Task.process_results`), one call per document over its repeats as lm-eval makes
it. The rows match outcomes.jsonl's, labelled with the method, so the paired accuracy test of the
reports (spot_eval.reports.regression.lossy_accuracy) can set them against draft-free's.
"""

from __future__ import annotations

from collections.abc import Iterator

from lm_eval.api.instance import Instance


def score_texts(task_dict: object, texts: dict[tuple[str, int, str], list[str]]) -> list[dict]:
    """One row {task, doc_id, filter, metric, value, label} per (task, doc_id, label) of `texts` (its texts in
    repeat order), filter and numeric metric. `task_dict`: what lm-eval's `evaluate` was given (it holds every
    task this process decoded for, with its documents)."""
    if not texts:
        return []
    tasks, docs = {}, {}
    for task in _tasks(task_dict):
        for instance in task.instances:
            tasks[instance.task_name] = task
            docs[(instance.task_name, instance.doc_id)] = instance.doc
    rows = []
    for (name, doc_id, label), responses in texts.items():
        task, doc = tasks[name], docs[(name, doc_id)]
        instance = Instance("generate_until", doc, ("", {}), 0, (name, doc_id, len(responses)))
        instance.resps = list(responses)
        for ensemble in task._filters:
            ensemble.apply([instance])
            metrics = task.process_results(doc, [instance.filtered_resps[ensemble.name]])
            rows += [{"task": name, "doc_id": doc_id, "filter": ensemble.name, "metric": metric, "value": float(value),
                      "label": label} for metric, value in metrics.items() if isinstance(value, (int, float))]
    return rows


def _tasks(node: object) -> Iterator:
    """Every task object in lm-eval's task dict, whatever its nesting (groups hold tasks or groups)."""
    if isinstance(node, dict):
        for value in node.values():
            yield from _tasks(value)
    elif hasattr(node, "process_results") and hasattr(node, "instances"):
        yield node
