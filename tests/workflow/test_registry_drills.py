"""The registry's change drills (issue 26, outcome 3; docs/ARCHITECTURE.md), through the snakemake
command line with the registry changed in one place only, as a contributor would change it:

- a stage added to the registry (and its config block) gets its rules, folder, resources,
  checkpoint flags and viewer input with no other edit (a dry run);
- stage 2's results folder moved in the registry (`folder="refiner"`): the real tiny pipeline
  passes and writes nothing under results/stage2/ (slow).

The change is made by a sitecustomize.py on PYTHONPATH, so snakemake and every `vcloud` job it
starts see the same changed registry.
"""

from __future__ import annotations

import os
import re
import subprocess
import textwrap

import pytest
import yaml

from tests.workflow.snakemake_run import ONE_REGION, ROOT, SMALL, SNAKEMAKE

pytestmark = pytest.mark.workflow

SITE = textwrap.dedent('''
    """Changes the stage registry as the drill of VCLOUD_REGISTRY_DRILL does (tests only)."""
    import dataclasses
    import os

    drill = os.environ.get("VCLOUD_REGISTRY_DRILL")
    if drill:
        from vcloud import registry

        if drill == "move":  # one edit: stage 2's folder
            registry.STAGES = tuple(dataclasses.replace(s, folder="refiner") if s.number == 2 else s
                                    for s in registry.STAGES)
        elif drill == "add":  # stage 4: fine-tunes stage 3's refiner; its config block is stage 3's kind
            from vcloud.config import model_sets

            model_sets.ModelSetConfig = dataclasses.make_dataclass(
                "ModelSetConfig", [("stage4", model_sets.Stage3Config, dataclasses.field(default=None))],
                bases=(model_sets.ModelSetConfig,), frozen=True)
            stage4 = dataclasses.replace(registry.get_stage(3), number=4, upstream=(1, 3), predictor_needs=(1, 4),
                                         viewer_label="stage 4 fine-tuned", label="fine-tuned", folder="",
                                         trains="stage2", predictor="vcloud.evaluation.predict:refined")
            registry.STAGES = (*registry.STAGES, stage4)
            registry.STAGE_NUMBERS = tuple(s.number for s in registry.STAGES)
            registry.VIEWER_STAGES = tuple(s.number for s in registry.STAGES if s.viewer_label)
''')


def drill_env(tmp_path, drill: str) -> dict:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITE)
    path = os.pathsep.join([str(site), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path, VCLOUD_REGISTRY_DRILL=drill)


def snakemake(args, *, work, env, check=True):
    proc = subprocess.run(
        [*SNAKEMAKE, *args, "-d", str(work)], cwd=work, env=env, capture_output=True, text=True, timeout=1800
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def test_a_stage_added_to_the_registry_gets_its_rules_folder_resources_and_viewer_input(tmp_path):
    models = yaml.safe_load((ROOT / "tests/workflow/tiny_models.yaml").read_text())
    models["stage4"] = models["stage3"]  # its config block
    (tmp_path / "models.yaml").write_text(yaml.safe_dump(models))
    (tmp_path / "small.yaml").write_text(yaml.safe_dump({**SMALL, "model_config": str(tmp_path / "models.yaml")}))
    proc = snakemake(["-n", "-p", "--configfile", "small.yaml"], work=tmp_path, env=drill_env(tmp_path, "add"))
    text = proc.stdout + proc.stderr
    for rule in ("train_stage4", "evaluate_stage4"):
        assert any(line.split() == [rule, "1"] for line in text.splitlines()), text[-3000:]
    blocks = {m.group(1): m.group(2) for m in re.finditer(r"rule (\w+):\n(.*?)(?:\n\n|\Z)", text, re.S)}
    train = blocks["train_stage4"]
    assert "output: results/stage4/best.pt, results/stage4/metrics.jsonl" in train, train
    assert "--stage1 results/stage1/best.pt" in train and "--stage3 results/stage3/best.pt" in train, train
    assert "runtime=60" in train and "cpus_per_task=2" in train and "mem_mb=4000" in train, train  # registry default
    evaluate = blocks["evaluate_stage4"]
    assert "--stage4 results/stage4/best.pt" in evaluate and "--out results/eval/stage4.json" in evaluate, evaluate
    assert "--stage4 results/stage4/best.pt" in blocks["export_viewer"]  # its viewer layer's checkpoint
    assert "results/report/curves/stage4.png" in blocks["report_curves"]


@pytest.mark.slow
def test_a_results_folder_moved_in_the_registry_passes_the_real_tiny_pipeline(tmp_path):
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(ONE_REGION))
    env = drill_env(tmp_path, "move")
    snakemake(["--cores", "2", "--configfile", "small.yaml"], work=tmp_path, env=env)
    results = tmp_path / "results"
    assert {p.name for p in (results / "refiner").iterdir()} >= {"best.pt", "latest.pt", "metrics.jsonl"}
    assert not (results / "stage2").exists()
    assert (results / "report/curves/stage2.png").is_file()  # named after the stage, not its folder
    assert (results / "eval/stage2.json").is_file() and (results / "viewer/index.html").is_file()
    # Nothing left to do: every output is there and up to date.
    again = snakemake(["-n", "--cores", "2", "--configfile", "small.yaml"], work=tmp_path, env=env)
    assert "Nothing to be done" in again.stdout + again.stderr
