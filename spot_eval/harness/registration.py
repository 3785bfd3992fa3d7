"""Registering `spot` with lm-eval 0.4.13, which has no plugin discovery.

`register()` adds a lazy `spot` entry (torch and the model load only when `--model spot` is
used), imports `lm_eval.models` first so the built-ins (`hf`, `dummy`, ...) stay resolvable, and
wraps `lm_eval.evaluator.evaluate` so that a SpotLM sees the scored results: accuracy lands in
the same run as the decoding statistics even under the plain `lm_eval` command (and the evaluated
tasks, which score a lossy method's own texts: spot_eval.harness.rescore). Under lm-eval's command line
it also wraps the `run` command, so that what a run says last (`say_last`: its summary, the run directory
and the MLflow link) prints after lm-eval's own results table, which lm-eval prints after evaluate returns.
The installed `spot_eval_lm_eval.pth` (see setup.py; a regular or an editable install) runs
`at_startup()` in every interpreter of the environment, which calls `cli_startup()` only when the
program is lm-eval's command line: the `lm_eval`/`lm-eval` console script or `python -m lm_eval`
(what `accelerate launch -m lm_eval` starts). This module imports only the standard library until
then. Newer lm-eval reads the `lm_eval.models` entry point declared in pyproject.toml instead.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

TARGET = "spot_eval.harness.lm:SpotLM"
OURS = tuple(Path(__file__).resolve().parent.parent.parent / name for name in ("spot", "spot_eval"))  # our packages' folders


CLI_NAMES = ("lm_eval", "lm-eval")  # the console scripts
MODULES = ("lm_eval", "lm_eval.__main__")  # python -m ...


def at_startup() -> None:
    """Run by the installed `spot_eval_lm_eval.pth` in every interpreter of the environment: registers
    `spot` (`cli_startup`) when lm-eval's command line is the program, and does nothing otherwise."""
    if is_lm_eval_cli(sys.argv, getattr(sys, "orig_argv", [])):
        cli_startup()


def is_lm_eval_cli(argv: list[str], orig_argv: list[str]) -> bool:
    """Whether the interpreter runs lm-eval's command line: the console script (argv[0] is its path), or
    `python -m lm_eval` (at .pth time argv[0] is still '-m', and orig_argv names the module)."""
    if argv and Path(argv[0]).name in CLI_NAMES:
        return True
    if argv[:1] != ["-m"]:
        return False
    for i, arg in enumerate(orig_argv[1:], start=1):  # the first -m among the interpreter's options
        if arg == "-m":
            return i + 1 < len(orig_argv) and orig_argv[i + 1] in MODULES
        if arg.startswith("-m"):
            return arg[2:] in MODULES
    return False


def cli_startup() -> None:
    """Register, and turn our bad-input errors into one `error:` line (exit 2) instead of a traceback. A run of
    `--model spot` also keeps lm-eval's index of its task library between runs (spot_eval.harness.task_index)."""
    register()
    if runs_spot(sys.argv):
        from spot_eval.harness import task_index

        task_index.install()
    from lm_eval._cli.run import Run

    if not getattr(Run._execute, "_spot_wrapped", False):
        Run._execute = staticmethod(_last_words(Run._execute))
    default_hook = sys.excepthook

    def hook(kind, error, tb):
        ours = any(frame.tb_frame.f_globals.get("__name__", "").startswith(("spot.", "spot_eval.")) for frame in _frames(tb))
        if ours and issubclass(kind, (ValueError, FileNotFoundError)):
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)
        default_hook(kind, error, tb)

    sys.excepthook = hook
    default_format = warnings.formatwarning

    def formatted(message, category, filename, lineno, line=None) -> str:
        """Our warnings as one `warning: ...` line, as spot-eval's commands print them; everyone else's as they were."""
        if any(Path(filename).resolve().is_relative_to(folder) for folder in OURS):
            return f"warning: {message}\n"
        return default_format(message, category, filename, lineno, line)

    warnings.formatwarning = formatted


def runs_spot(argv: list[str]) -> bool:
    """Whether lm-eval's command line names `--model spot`."""
    return any(a == "--model=spot" or (a == "--model" and argv[i + 1 : i + 2] == ["spot"]) for i, a in enumerate(argv))


def _frames(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


def register() -> None:
    import lm_eval.evaluator
    import lm_eval.models  # noqa: F401  (fills the registry with the built-ins first)
    from lm_eval.api.registry import model_registry

    if "spot" not in model_registry:
        model_registry.register("spot", target=TARGET)
    task_log = logging.getLogger("lm_eval.api.task")
    if not any(isinstance(f, _OwnDatasets) for f in task_log.filters):
        task_log.addFilter(_OwnDatasets())
    if not getattr(lm_eval.evaluator.evaluate, "_spot_wrapped", False):
        lm_eval.evaluator.evaluate = _reporting(lm_eval.evaluator.evaluate)
    if not getattr(lm_eval.evaluator.simple_evaluate, "_spot_wrapped", False):
        lm_eval.evaluator.simple_evaluate = _consents_first(lm_eval.evaluator.simple_evaluate)
    lm_eval.evaluator.get_git_commit_hash = quiet_git_hash


def quiet_git_hash() -> str | None:
    """lm-eval's `get_git_commit_hash` without git's "fatal: not a git repository" on the terminal when the run
    is not in a checkout: `git describe --always` in the working directory, else lm-eval's own fallback."""
    from lm_eval.loggers.utils import get_commit_from_path

    try:
        done = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        done = None
    if done is not None and done.returncode == 0:
        return done.stdout.strip()
    return get_commit_from_path(os.getcwd())


class _OwnDatasets(logging.Filter):
    """Drops lm-eval's "Custom kwargs can be passed to `--metadata`" warning for the spot_* tasks, whose
    `custom_dataset` loaders read the vendored data and take no kwargs (once per task and run otherwise)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("spot_") and "Custom kwargs can be passed to `--metadata`" in message)


UNSAFE_CODE_FIX = ("On the command line add --confirm_run_unsafe_code: the code tasks execute model-written programs "
                   "(spot_eval runs them in a sandboxed subprocess).")
CODE_EVAL_FIX = ("Set HF_ALLOW_CODE_EVAL=1 in the environment (HF_ALLOW_CODE_EVAL=1 lm_eval ...): they score through "
                 "evaluate's code_eval, which refuses to run without it (`spot-eval cache-datasets` installs one that "
                 "runs them in the sandbox).")


def _consents_first(simple_evaluate):
    """A `--model spot` run of code tasks without the consents they need (--confirm_run_unsafe_code for every
    code task, HF_ALLOW_CODE_EVAL=1 for those scored by evaluate's code_eval) stops before the model loads, in one
    line naming what is missing. lm-eval checks the first only in `evaluate()`, after the model has loaded, and
    the second when it imports the task's utils."""

    @functools.wraps(simple_evaluate)
    def wrapped(*args, **kwargs):
        manager, tasks = kwargs.get("task_manager"), kwargs.get("tasks")
        if kwargs.get("model") == "spot" and manager is not None and tasks:
            from spot_eval.harness.consents import code_tasks

            found = code_tasks(manager.task_index, [tasks] if isinstance(tasks, str) else tasks)
            missing = []
            if found and not kwargs.get("confirm_run_unsafe_code"):
                missing.append(f"{', '.join(t.name for t in found)} run model-written code. {UNSAFE_CODE_FIX}")
            needs_env = [t.name for t in found if t.code_eval]
            if needs_env and os.environ.get("HF_ALLOW_CODE_EVAL") != "1":
                missing.append(f"{', '.join(needs_env)} need HF_ALLOW_CODE_EVAL=1. {CODE_EVAL_FIX}")
            if missing:
                raise ValueError(" ".join(missing))
        return simple_evaluate(*args, **kwargs)

    wrapped._spot_wrapped = True
    return wrapped


# While lm-eval's `run` command runs (under `_last_words`): the lines a run says last, printed after lm-eval's table.
_closing: list[str] | None = None


def say_last(lines: list[str]) -> None:
    """Print `lines` as the run's last words: at once outside lm-eval's command line (a program that calls
    simple_evaluate), else after lm-eval has printed its results table, as the command's last lines."""
    if _closing is None:
        print("\n".join(lines), flush=True)
    else:
        _closing.extend(lines)


def _last_words(execute):
    """lm-eval's `run` command, then the lines `say_last` kept: also when the run ends with an error (a divergence
    ends it with SystemExit after the files are written), so the pointers to them are never lost."""

    @functools.wraps(execute)
    def wrapped(args) -> None:
        global _closing
        _closing = []
        try:
            execute(args)
        finally:
            lines, _closing = _closing, None
            if lines:
                print("\n".join(lines), flush=True)

    wrapped._spot_wrapped = True
    return wrapped


def _reporting(evaluate):
    @functools.wraps(evaluate)
    def wrapped(lm, *args, **kwargs):
        inner = getattr(lm, "lm", lm)  # unwrap lm-eval's CachingLM
        ours = hasattr(inner, "session")
        given = inspect.signature(evaluate).bind_partial(lm, *args, **kwargs).arguments
        if ours:  # --samples' documents by their index in the split (SpotLM.document)
            inner.samples = given.get("samples")
        try:
            results = evaluate(lm, *args, **kwargs)
        except ValueError as err:
            if "marked as unsafe" not in str(err):
                raise
            raise ValueError(f"{err} {UNSAFE_CODE_FIX}") from None
        finish = getattr(inner, "finish", None) if ours else None
        if callable(finish):
            finish(results, given.get("task_dict"), limit=given.get("limit"))
        return results

    wrapped._spot_wrapped = True
    return wrapped
