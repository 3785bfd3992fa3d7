"""Code tasks are found from their YAML before anything loads, through groups, tags and inline configs."""

from pathlib import Path

from lm_eval.tasks._index import TaskIndex

from spot_eval.harness.consents import unsafe_tasks

REPO = Path(__file__).resolve().parent.parent


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
