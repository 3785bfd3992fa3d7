"""The documents of the spot_* tasks: the vendored test sets of `spot_eval.data.datasets`, never the hub.

Each function is a task's `custom_dataset`. lm-eval calls it as `load(**metadata, **dataset_kwargs)` (and the CLI
merges model_args into metadata), so it takes and ignores **kwargs; it returns the one split the tasks use.
"""

from __future__ import annotations

import datasets

from spot_eval.data import datasets as vendored


def _test_split(rows: list[dict]) -> datasets.DatasetDict:
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def load_gsm8k(**kwargs) -> datasets.DatasetDict:
    return _test_split(vendored.load("gsm8k_test"))


def load_math500(**kwargs) -> datasets.DatasetDict:
    return _test_split(vendored.load("math500_test"))


def load_humaneval(**kwargs) -> datasets.DatasetDict:
    return _test_split(vendored.load("humaneval_test"))


def load_mbpp(**kwargs) -> datasets.DatasetDict:
    return _test_split(vendored.mbpp_split("test"))
