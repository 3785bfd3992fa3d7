"""Installs `spot_eval_lm_eval.pth` beside the packages: lm-eval 0.4.13 has no plugin discovery, so
this one line registers `--model spot` when (and only when) the `lm_eval` console script runs.
Everything else about the package is in pyproject.toml."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH_NAME = "spot_eval_lm_eval.pth"
PTH_LINE = (
    "import sys; sys.argv and sys.argv[0].endswith(('lm_eval', 'lm-eval')) "
    "and __import__('spot_eval.harness.registration').harness.registration.cli_startup()\n"
)


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        Path(self.build_lib, PTH_NAME).write_text(PTH_LINE)

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib, PTH_NAME))]


setup(cmdclass={"build_py": BuildPyWithPth})
