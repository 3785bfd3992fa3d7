"""The vendored benchmarks written where `datasets` finds lm-eval's own tasks' data with the hub offline.

lm-eval 0.4.13's `gsm8k`, `minerva_math500`, `mbpp` and `humaneval` load hub datasets by id. With
`HF_DATASETS_OFFLINE=1`, `datasets` (5.x) does not read hub snapshots: it takes the newest prepared copy in
its own cache, `HF_DATASETS_CACHE/<namespace>___<name>/<config>/<version>/<hash>/`. So each dataset is
prepared there by `datasets`' own Parquet builder from the vendored rows, with the hub's splits and columns,
under a fixed hash (`VENDORED`) that marks the copy as ours.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from spot_eval.data.datasets import load, mbpp_split

VENDORED = "spot-eval-vendored"


@dataclass(frozen=True)
class HubDataset:
    """One hub dataset as an lm-eval task YAML names it, and how its rows come from the vendored files."""

    repo_id: str
    config: str
    splits: dict[str, Callable[[], list[dict]]]
    columns: dict[str, str]  # the hub's, in its order: name -> "string", "int32", "int64" or "strings" (a list)

    def rows(self, split: str) -> list[dict]:
        return [{c: row[c] for c in self.columns} for row in self.splits[split]()]

    def features(self):
        """The hub's column types (an empty list in one split must not decide a column's type)."""
        from datasets import Features, List, Value

        kinds = {"string": Value("string"), "int32": Value("int32"), "int64": Value("int64"), "strings": List(Value("string"))}
        return Features({name: kinds[kind] for name, kind in self.columns.items()})


HUB_DATASETS = (
    HubDataset("openai/gsm8k", "main", {"train": lambda: load("gsm8k_train"), "test": lambda: load("gsm8k_test")},
               {"question": "string", "answer": "string"}),
    HubDataset("HuggingFaceH4/MATH-500", "default", {"test": lambda: load("math500_test")},
               {"problem": "string", "solution": "string", "answer": "string", "subject": "string", "level": "int64",
                "unique_id": "string"}),
    HubDataset("google-research-datasets/mbpp", "full", {s: (lambda s=s: mbpp_split(s)) for s in ("train", "test", "validation", "prompt")},
               {"task_id": "int32", "text": "string", "code": "string", "test_list": "strings", "test_setup_code": "string",
                "challenge_test_list": "strings"}),
    HubDataset("openai/openai_humaneval", "openai_humaneval", {"test": lambda: load("humaneval_test")},
               {"task_id": "string", "prompt": "string", "canonical_solution": "string", "test": "string", "entry_point": "string"}),
)


@dataclass(frozen=True)
class Written:
    """What `cache_datasets` did for one dataset: `wrote` False where an identical copy was already there."""

    repo_id: str
    config: str
    path: Path
    rows: dict[str, int]
    wrote: bool


class DifferentCopy(ValueError):
    """A prepared copy that spot-eval did not write, or an edited one, is where the vendored one would go."""


def prepared_dir(cache: Path, dataset: HubDataset) -> Path:
    """Where `datasets` looks for a prepared copy (it snake-cases the name: MATH-500 -> math-500)."""
    from datasets.naming import camelcase_to_snakecase

    namespace, name = dataset.repo_id.split("/")
    return cache / f"{namespace}___{camelcase_to_snakecase(name)}" / dataset.config


def cache_datasets(cache: Path | None = None) -> list[Written]:
    """Prepare every `HUB_DATASETS` entry in `cache` (default: `datasets`' HF_DATASETS_CACHE). A copy already
    there with the same rows is left as it is; any other prepared copy of that dataset and config (another
    hash: from the hub, or edited) is refused, never overwritten, since `datasets` would load the newest."""
    import datasets

    cache = Path(cache or datasets.config.HF_DATASETS_CACHE)
    done = []
    for dataset in HUB_DATASETS:
        where = prepared_dir(cache, dataset)
        ours = [p for p in where.glob(f"*/{VENDORED}") if p.is_dir()]
        others = [p for p in where.glob("*/*") if p.is_dir() and p.name != VENDORED]
        if others:
            raise DifferentCopy(f"{dataset.repo_id} ({dataset.config}) already has a copy in {others[0]} that spot-eval did not "
                                "write; datasets would load the newest of the two. Remove that directory to use the vendored "
                                "copy, or keep it and skip cache-datasets")
        rows = {split: dataset.rows(split) for split in dataset.splits}  # each vendored file read (and verified) once
        counts = {split: len(r) for split, r in rows.items()}
        if ours:
            if read_rows(cache, dataset) != rows:
                raise DifferentCopy(f"{ours[0]} differs from the vendored {dataset.repo_id}: remove it and run cache-datasets again")
            done.append(Written(dataset.repo_id, dataset.config, ours[0], counts, wrote=False))
            continue
        done.append(Written(dataset.repo_id, dataset.config, _prepare(cache, dataset, rows), counts, wrote=True))
    return done


def read_rows(cache: Path, dataset: HubDataset) -> dict[str, list[dict]]:
    """The rows `datasets` loads from `cache` for `dataset`, per split, the hub offline."""
    import datasets

    loaded = datasets.load_dataset(dataset.repo_id, dataset.config, cache_dir=str(cache))
    return {split: loaded[split].to_list() for split in loaded}


def _prepare(cache: Path, dataset: HubDataset, rows: dict[str, list[dict]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets.packaged_modules.parquet.parquet import Parquet

    namespace, name = dataset.repo_id.split("/")

    def relative_data_dir(self, with_version=True, with_hash=True) -> str:
        # datasets names a hub dataset's cache folder <namespace>___<name>; a builder given a repo_id would
        # insist its data files live in that repo, so the namespace is added here instead.
        return f"{namespace}___{Parquet._relative_data_dir(self, with_version, with_hash)}"

    # In Parquet's own module: datasets patches the globals of a builder's module (Path, open, ...) for
    # streaming, and this module's must stay the standard library's.
    Vendored = type("Vendored", (Parquet,), {"_relative_data_dir": relative_data_dir, "__module__": Parquet.__module__})

    features = dataset.features()
    with tempfile.TemporaryDirectory() as scratch:
        files = {}
        for split, split_rows in rows.items():
            files[split] = [str(Path(scratch) / f"{split}.parquet")]
            pq.write_table(pa.Table.from_pylist(split_rows, schema=features.arrow_schema), files[split][0])
        builder = Vendored(cache_dir=str(cache), dataset_name=name, config_name=dataset.config, config_id=dataset.config,
                           data_files=files, hash=VENDORED, features=features)
        builder.download_and_prepare()
    return Path(builder.cache_dir)
