"""Installs `spot_eval_lm_eval.pth` beside the packages: lm-eval 0.4.13 has no plugin discovery, so
this one line registers `--model spot` when (and only when) lm-eval's command line starts: the
`lm_eval` / `lm-eval` console script, or `python -m lm_eval` (what `accelerate launch -m lm_eval`
runs in every process). Other interpreters never import the package. It is installed by a regular
install and by an editable one (`pip install -e .`) alike. Everything else is in pyproject.toml."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH_NAME = "spot_eval_lm_eval.pth"
# One line, as .pth files require. It imports only the standard library and the registration module,
# which imports lm-eval only when lm-eval's command line is the program (at_startup decides).
PTH_LINE = "import spot_eval.harness.registration; spot_eval.harness.registration.at_startup()\n"


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        Path(self.build_lib, PTH_NAME).write_text(PTH_LINE)

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib, PTH_NAME))]


class _WithPth:
    """An editable-install strategy that also writes the start-up line into the wheel."""

    def __init__(self, strategy) -> None:
        self.strategy = strategy

    def __call__(self, wheel, files, mapping) -> None:
        self.strategy(wheel, files, mapping)
        wheel.writestr(PTH_NAME, PTH_LINE)

    def __enter__(self):
        self.strategy.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.strategy.__exit__(*exc)


class EditableWheelWithPth(editable_wheel):
    # An editable wheel holds only a path hook, not build_py's outputs: add the line to it.
    def _select_strategy(self, name, tag, build_lib):
        return _WithPth(super()._select_strategy(name, tag, build_lib))


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
