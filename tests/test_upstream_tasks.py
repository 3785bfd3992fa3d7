"""Our four tasks and lm-eval's, side by side: the same documents in the same order, the same targets and stops,
prompts that differ only as documented (README, "Our tasks and lm-eval's"), and the same scores for the same
responses except where the README says why (a chat answer's fenced code, a bare \\boxed{} answer).

Both are built by lm-eval's TaskManager from a fresh HF_HOME that `spot-eval cache-datasets` prepared, and scored
as lm-eval's evaluator scores (tests/upstream_agreement.py), the code tasks in the sandbox."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spot_eval.data.datasets import load, mbpp_split
from spot_eval.data.hub_cache import cache_datasets
from spot_eval.execution import problems
from spot_eval.execution.metric_cache import install_code_eval

REPO = Path(__file__).resolve().parent.parent
PAIRS = {"gsm8k": "spot_gsm8k", "minerva_math500": "spot_math500", "mbpp": "spot_mbpp", "humaneval": "spot_humaneval"}
DOC_COLUMNS = {"gsm8k": ["question", "answer"], "minerva_math500": ["problem", "solution", "answer"],
               "mbpp": ["task_id", "text", "code", "test_list", "test_setup_code"], "humaneval": ["task_id", "prompt", "test"]}

gsm8k, math500, mbpp, humaneval = load("gsm8k_test"), load("math500_test"), mbpp_split("test"), load("humaneval_test")
RESPONSES = {  # [doc, response] for each pair of tasks
    "gsm8k": [[0, gsm8k[0]["answer"]], [1, "She needs 2 + 1 = 3 bolts, so the answer is 3."], [2, "#### 1,000"]],
    "minerva_math500": [
        [1, f"Final Answer: The final answer is ${math500[1]['answer']}$. I hope it is correct."],
        [1, f"So the answer is $\\boxed{{{math500[1]['answer']}}}$."],
        [2, "Final Answer: The final answer is $7$. I hope it is correct."]],
    "mbpp": [[0, mbpp[0]["code"]], [0, "def remove_Occ(s, ch):\n    return s\n"],
             [0, f"Here it is:\n```python\n{mbpp[0]['code']}\n```\n"]],
    "humaneval": [[0, humaneval[0]["canonical_solution"]], [0, "    return False\n"],
                  [0, f"```python\n{humaneval[0]['prompt']}{humaneval[0]['canonical_solution']}```\n"]],
}
LIMIT = 3


# One worker runs the module (pytest-xdist --dist loadgroup), so its upstream evaluation runs once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("upstream_tasks")]


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("upstream")
    env = {**os.environ, "HF_HOME": str(tmp / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_EVALUATE_OFFLINE": "1", "HF_ALLOW_CODE_EVAL": "1"}
    for variable in ("HF_MODULES_CACHE", "HF_DATASETS_CACHE"):
        env.pop(variable, None)
    cache_datasets(tmp / "hf" / "datasets")  # what `spot-eval cache-datasets` does (tests/test_hub_cache.py runs the command)
    install_code_eval(tmp / "hf" / "modules")
    responses = {name: pairs for upstream, pairs in RESPONSES.items() for name in (upstream, PAIRS[upstream])}
    spec = tmp / "spec.json"
    spec.write_text(json.dumps({"include_path": str(REPO / "tasks"), "limit": LIMIT, "responses": responses}))
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("upstream_agreement.py")), str(spec)],
                         capture_output=True, text=True, env=env, cwd=tmp, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


@pytest.mark.parametrize("upstream", PAIRS)
def test_the_same_documents_in_the_same_order_with_the_same_targets(tasks, upstream):
    theirs, ours = tasks[upstream], tasks[PAIRS[upstream]]
    columns = DOC_COLUMNS[upstream]
    assert len(ours["docs"]) == len(theirs["docs"]) == {"gsm8k": 1319, "minerva_math500": 500, "mbpp": 500, "humaneval": 164}[upstream]
    assert [[d[c] for c in columns] for d in ours["docs"]] == [[d[c] for c in columns] for d in theirs["docs"]]
    assert ours["targets"] == theirs["targets"]


@pytest.mark.parametrize("upstream", ["mbpp", "humaneval"])
def test_upstreams_code_references_are_known_problems_so_their_helpers_are_the_judges(tasks, upstream):
    """What lm-eval's own tasks hand code_eval is each problem's test code; the sandboxed code_eval recognises every
    one, so a HumanEval prompt's helpers run in the judge there too (tests/test_sandbox_attacks.py)."""
    recognised = [problems.lookup(target).problem for target in tasks[upstream]["targets"]]
    docs = {"mbpp": [f"mbpp/{d['task_id']}" for d in mbpp], "humaneval": [d["task_id"] for d in humaneval]}[upstream]
    assert recognised == docs[:LIMIT]


def test_prompts_differ_only_as_documented(tasks):
    def prompts(name):
        return tasks[name]["prompts"]

    def kwargs(name):
        return tasks[name]["generation_kwargs"]

    # Ours are zero-shot prompts for a chat model: the bare question, problem, task and tests, or instruction.
    q = [d["question"] for d in gsm8k[:LIMIT]]
    assert prompts("gsm8k") == [f"Question: {x}\nAnswer:" for x in q] and prompts("spot_gsm8k") == q
    p = [d["problem"] for d in math500[:LIMIT]]
    assert prompts("minerva_math500") == [f"Problem:\n{x}\n\nSolution:" for x in p] and prompts("spot_math500") == p
    tests = ["\n".join(d["test_list"]) for d in mbpp[:LIMIT]]
    assert prompts("mbpp") == [f"You are an expert Python programmer, and here is your task: {d['text']} Your code should pass "
                               f"these tests:\n\n{t}\n[BEGIN]\n" for d, t in zip(mbpp, tests, strict=False)]
    assert prompts("spot_mbpp") == [f"{d['text']}\n{t}" for d, t in zip(mbpp, tests, strict=False)]
    # humaneval continues the prompt; ours asks for a solution in the words of lm-eval's humaneval_instruct.
    assert prompts("humaneval") == [d["prompt"] for d in humaneval[:LIMIT]]
    assert prompts("spot_humaneval") == [
        f"Write a solution to the following problem and make sure that it passes the tests:\n```python\n{d['prompt']}\n```\n"
        for d in humaneval[:LIMIT]]
    # Few-shot: lm-eval's defaults are 5, 4, 3 and 0 examples; ours are all zero-shot.
    assert [tasks[t]["default_fewshot"] for t in PAIRS] == [5, 4, 3, 0]
    assert all(tasks[t]["default_fewshot"] == 0 for t in PAIRS.values())
    # Stops: the same for gsm8k and MATH; the code tasks of a chat model stop at its end of turn instead of at
    # "[DONE]" (mbpp's few-shot closing) or a new top-level statement (humaneval's continuation).
    for upstream in ("gsm8k", "minerva_math500"):
        assert kwargs(upstream)["until"] == kwargs(PAIRS[upstream])["until"]
    assert kwargs("mbpp")["until"] == ["[DONE]"] and kwargs("humaneval")["until"] == ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]
    assert kwargs("spot_mbpp")["until"] == kwargs("spot_humaneval")["until"] == []
    # At most 256 new tokens (lm-eval's default where a task names none); humaneval allows 1024.
    assert kwargs("humaneval")["max_gen_toks"] == 1024 and "max_gen_toks" not in kwargs("gsm8k")
    assert {kwargs(ours)["max_gen_toks"] for ours in PAIRS.values()} == {256}


def scores(tasks, name):
    """Each response's metrics under the task's one filter."""
    return [next(iter(s.values())) for s in tasks[name]["scores"] if len(s) == 1]


def test_gsm8k_scores_every_response_the_same(tasks):
    assert tasks["gsm8k"]["scores"] == tasks["spot_gsm8k"]["scores"]
    assert [(s["strict-match"]["exact_match"], s["flexible-extract"]["exact_match"]) for s in tasks["gsm8k"]["scores"]] == [
        (1.0, 1.0), (0.0, 1.0), (0.0, 0.0)]  # gold; a right number without "####"; a wrong one


def test_math500_scores_the_same_but_a_bare_boxed_answer(tasks):
    theirs, ours = scores(tasks, "minerva_math500"), scores(tasks, "spot_math500")
    assert [s["exact_match"] for s in theirs] == [1, 0, 0]
    assert [s["exact_match"] for s in ours] == [1, 1, 0]  # ours also grades the last \boxed{} when Minerva's sentence is absent
    assert [s["math_verify"] for s in theirs] == [s["math_verify"] for s in ours] == [1, 1, 0]


@pytest.mark.parametrize("upstream", ["mbpp", "humaneval"])
def test_code_tasks_score_bare_code_the_same_and_a_fenced_answer_only_ours(tasks, upstream):
    # lm-eval names the metric: mbpp for its function (pass_at_1), humaneval for the key that function returns.
    theirs = [s[{"mbpp": "pass_at_1", "humaneval": "pass@1"}[upstream]] for s in scores(tasks, upstream)]
    ours = [s["pass@1"] for s in scores(tasks, PAIRS[upstream])]
    assert theirs == [1.0, 0.0, 0.0]  # right code; wrong code; right code inside a chat answer's ``` fence
    assert ours == [1.0, 0.0, 1.0]
