"""Code tasks and the consents they need are found from their YAML before anything loads, through groups, tags and
inline configs."""

from pathlib import Path
from types import SimpleNamespace

import lm_eval.tasks
import pytest
from lm_eval.tasks._index import TaskIndex

from spot_eval.harness.consents import CodeTask, code_tasks
from spot_eval.harness.registration import _consents_first

REPO = Path(__file__).resolve().parent.parent
LM_EVAL_TASKS = Path(lm_eval.tasks.__file__).parent


def unsafe_tasks(index, names) -> list[str]:
    return [task.name for task in code_tasks(index, names)]


def test_the_projects_code_tasks_are_found_alone_and_in_the_group():
    index = TaskIndex.build([REPO / "tasks"])
    assert unsafe_tasks(index, ["spot_all"]) == ["spot_humaneval", "spot_mbpp"]
    assert unsafe_tasks(index, ["spot_gsm8k", "spot_math500"]) == []
    assert unsafe_tasks(index, ["spot_mbpp", "spot_all"]) == ["spot_mbpp", "spot_humaneval"]
    assert unsafe_tasks(index, ["no_such_task"]) == []  # lm-eval reports it


def test_groups_tags_and_inline_configs(tmp_path):
    (tmp_path / "safe.yaml").write_text("task: safe\ntag: [mixed]\ndataset_path: x\noutput_type: generate_until\n")
    (tmp_path / "code.yaml").write_text("task: code\ntag: [mixed]\nunsafe_code: true\ndataset_path: x\n"
                                        "output_type: generate_until\nprocess_results: !function utils.never_imported\n")
    (tmp_path / "plain_group.yaml").write_text("group: plain\ntask: [safe]\n")
    (tmp_path / "unsafe_group.yaml").write_text("group: risky\nunsafe_code: true\ntask: [safe]\n")
    (tmp_path / "nested.yaml").write_text("group: nested\ntask: [plain, {task: inline_code, unsafe_code: true}]\n")
    index = TaskIndex.build([tmp_path])
    assert unsafe_tasks(index, ["plain"]) == []
    assert unsafe_tasks(index, ["risky"]) == ["safe"]  # a group's unsafe_code reaches its members
    assert unsafe_tasks(index, ["mixed"]) == ["code"]  # a tag
    assert unsafe_tasks(index, ["nested"]) == ["inline_code"]
    assert unsafe_tasks(index, [{"task": "code"}, {"task": "x", "unsafe_code": True}]) == ["code", "x"]


def test_a_config_that_cannot_be_read_is_left_to_lm_eval(tmp_path):
    (tmp_path / "broken.yaml").write_text("task: broken\ndataset_path: x\n")
    index = TaskIndex.build([tmp_path])
    (tmp_path / "broken.yaml").write_text("task: broken\ninclude: missing.yaml\n")
    assert unsafe_tasks(index, ["broken"]) == []


def test_lm_evals_code_tasks_are_scored_by_code_eval_and_ours_are_not():
    index = TaskIndex.build([LM_EVAL_TASKS / "humaneval", LM_EVAL_TASKS / "mbpp", LM_EVAL_TASKS / "gsm8k", REPO / "tasks"])
    assert code_tasks(index, ["humaneval_instruct", "mbpp", "gsm8k", "spot_all"]) == [
        CodeTask("humaneval_instruct", code_eval=True),  # its metric comes from the included humaneval.yaml
        CodeTask("mbpp", code_eval=True), CodeTask("spot_humaneval", code_eval=False), CodeTask("spot_mbpp", code_eval=False)]


def test_a_metric_named_code_eval_or_a_module_that_loads_it(tmp_path):
    (tmp_path / "scoring.py").write_text("import evaluate\nmetric = evaluate.load( 'code_eval' )\ndef score(): ...\n")
    (tmp_path / "other.py").write_text("def score(): ...  # evaluate.load('exact_match')\n")
    (tmp_path / "named.yaml").write_text("task: named\nunsafe_code: true\ndataset_path: x\nmetric_list: [{metric: code_eval}]\n")
    (tmp_path / "utils.yaml").write_text("task: utils\nunsafe_code: true\ndataset_path: x\n"
                                         "metric_list: [{metric: !function scoring.score}]\n")
    (tmp_path / "own.yaml").write_text("task: own\nunsafe_code: true\ndataset_path: x\nprocess_results: !function other.score\n")
    index = TaskIndex.build([tmp_path])
    assert [t.code_eval for t in code_tasks(index, ["named", "utils", "own"])] == [True, True, False]


@pytest.mark.parametrize(("flag", "env", "missing"), [
    (False, None, ["humaneval, spot_mbpp run model-written code. On the command line add --confirm_run_unsafe_code",
                   "humaneval need HF_ALLOW_CODE_EVAL=1. Set HF_ALLOW_CODE_EVAL=1 in the environment"]),
    (True, "0", ["humaneval need HF_ALLOW_CODE_EVAL=1."]),
    (False, "1", ["humaneval, spot_mbpp run model-written code."]),
    (True, "1", []),
])
def test_the_missing_consents_are_named_in_one_line_before_anything_runs(monkeypatch, flag, env, missing):
    if env is None:
        monkeypatch.delenv("HF_ALLOW_CODE_EVAL", raising=False)
    else:
        monkeypatch.setenv("HF_ALLOW_CODE_EVAL", env)
    ran = []
    evaluate = _consents_first(lambda **kwargs: ran.append(kwargs))
    manager = SimpleNamespace(task_index=TaskIndex.build([LM_EVAL_TASKS / "humaneval", REPO / "tasks"]))
    run = dict(model="spot", tasks=["humaneval", "spot_mbpp"], task_manager=manager, confirm_run_unsafe_code=flag)
    if not missing:
        evaluate(**run)
        assert len(ran) == 1
        return
    with pytest.raises(ValueError) as refused:
        evaluate(**run)
    assert not ran and "\n" not in str(refused.value)
    for part in missing:
        assert part in str(refused.value)
    assert str(refused.value).count("HF_ALLOW_CODE_EVAL=1.") == (env != "1")
    evaluate(**{**run, "model": "hf"})  # other models are lm-eval's business
    assert len(ran) == 1
