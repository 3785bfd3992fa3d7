"""Run by tests/test_upstream_tasks.py in a fresh HF_HOME prepared by `spot-eval cache-datasets`: builds lm-eval's
tasks and ours through lm-eval's own TaskManager, and prints, as JSON, what each task shows a model (prompts,
targets, stops, few-shot count) and how it scores the responses it is given, the way lm-eval's evaluator does
(requests, filters, process_results). It is a separate process because lm-eval's code tasks load evaluate's
`code_eval` from HF_HOME when their utils module is imported.

usage: python upstream_agreement.py SPEC.json   (SPEC: {"include_path", "limit", "responses": {task: [[doc, text]]}})
"""

import json
import sys
from pathlib import Path

from lm_eval.tasks import TaskManager, get_task_dict

from spot_eval.harness import task_index


def describe(task, limit: int, responses: list[tuple[int, str]]) -> dict:
    default_fewshot = task.config.num_fewshot or 0
    task.set_config(key="num_fewshot", value=0)
    task.build_all_requests(limit=limit)
    instances = sorted(task.instances, key=lambda inst: inst.doc_id)
    docs = list(task.test_docs())
    scores = []
    for doc_id, text in responses:
        inst = instances[doc_id]
        inst.resps, inst.filtered_resps = [text], {}
        for ensemble in task._filters:
            ensemble.apply([inst])
        scores.append({key: task.process_results(inst.doc, [value]) for key, value in inst.filtered_resps.items()})
    return {
        "default_fewshot": default_fewshot,
        "docs": docs,
        "prompts": [inst.args[0] for inst in instances],
        "targets": [task.doc_to_target(inst.doc) for inst in instances],
        "generation_kwargs": instances[0].args[1],
        "scores": scores,
    }


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    task_index.install()  # lm-eval's task index from the cache `lm_eval --model spot` keeps (7 s to build, 0.5 s to read)
    tasks = get_task_dict(list(spec["responses"]), TaskManager(include_path=spec["include_path"]))
    print(json.dumps({name: describe(task, spec["limit"], spec["responses"][name]) for name, task in tasks.items()},
                     default=str))


if __name__ == "__main__":
    main(sys.argv[1])
