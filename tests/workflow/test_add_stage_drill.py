"""Adding a stage, as a contributor would, in a copy of the repository: five files change
outside tests (docs/ARCHITECTURE.md, "Adding a stage"), and the copy trains and scores the new
stage through snakemake. The drill's stage 4 is a second refiner over the stage-1 draft with its
own config section; the rules, paths, flags, resources, hash and predictor follow from the
registry."""

from __future__ import annotations

import filecmp
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.workflow.snakemake_run import ONE_REGION, ROOT, copy_worktree

pytestmark = pytest.mark.workflow

ENTRY = """    # stage 4 (the drill): a second refiner over the stage-1 draft, with its own settings
    Stage(4, upstream=(1,), predictor_needs=(1, 4), reads_wind=True,
          builder=f"{_BUILDERS}:stage4", predictor=f"{_PREDICTORS}:refined", needs_device=True,
          viewer_label="stage 4 refined again", validates_natural=True, label="refined again"),
"""

BUILDER = '''

def stage4(cfg: ModelSetConfig, *, train: Path, val: Path, stage1_ckpt: Path, wind=None, device: str = "cpu"):
    """The drill's stage 4: stage 2's task with the stage4 section's settings."""
    import dataclasses

    task = stage2(dataclasses.replace(cfg, stage2=cfg.stage4), train=train, val=val, stage1_ckpt=stage1_ckpt,
                  wind=wind, device=device)
    return dataclasses.replace(task, stage=4)
'''


def with_stage4_block(text: str) -> str:
    """The model config with a stage4 block: a copy of its stage2 block."""
    block = re.search(r"^stage2:.*?(?=^\S)", text, re.S | re.M).group(0)
    return text + "\n" + block.replace("stage2:", "stage4:", 1)


def add_stage_4(repo: Path) -> None:
    registry = repo / "src/vcloud/registry.py"
    text = registry.read_text()
    start = text.index("STAGES: tuple[Stage, ...] = (")
    close = text.index("\n)", start) + 1
    registry.write_text(text[:close] + ENTRY + text[close:])
    sets = repo / "src/vcloud/config/model_sets.py"
    sets.write_text(
        sets.read_text().replace(
            "    stage3: Stage3Config\n", "    stage3: Stage3Config\n    stage4: Stage2Config\n", 1
        )
    )
    stages = repo / "src/vcloud/train/stages.py"
    stages.write_text(stages.read_text() + BUILDER)
    for name in ("small.yaml", "full.yaml"):
        path = repo / "config/models" / name
        path.write_text(with_stage4_block(path.read_text()))
    tiny = repo / "tests/workflow/tiny_models.yaml"  # tests' own model set: not counted
    tiny.write_text(with_stage4_block(tiny.read_text()))


def changed_outside_tests(repo: Path) -> list[str]:
    found = []
    for path in sorted(repo.rglob("*")):
        name = str(path.relative_to(repo))
        if path.is_file() and not name.startswith("tests/") and "__pycache__" not in name:
            original = ROOT / name
            if not original.is_file() or not filecmp.cmp(path, original, shallow=False):
                found.append(name)
    return found


@pytest.mark.slow  # trains stages 1 and 4 of the tiny model set: ~1-2 min on 2 cores
def test_a_stage_added_in_five_files_trains_and_is_scored(tmp_path):
    repo = copy_worktree(tmp_path / "repo")
    add_stage_4(repo)
    assert changed_outside_tests(repo) == [
        "config/models/full.yaml",
        "config/models/small.yaml",
        "src/vcloud/config/model_sets.py",
        "src/vcloud/registry.py",
        "src/vcloud/train/stages.py",
    ]
    work = tmp_path / "work"
    work.mkdir()
    config = {**ONE_REGION, "model_config": str(repo / "tests/workflow/tiny_models.yaml")}
    (work / "small.yaml").write_text(yaml.safe_dump(config))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo / "src"), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile"), "--cores", "2", "-d", str(work)]
    command += ["results/eval/stage4.json", "results/report/curves/stage4.png", "--configfile", "small.yaml"]
    proc = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    report = yaml.safe_load((work / "results/eval/stage4.json").read_text())
    assert report["stage"] == 4
    assert {p.name for p in (work / "results/stage4").iterdir()} >= {"best.pt", "latest.pt", "metrics.jsonl"}
    assert (work / "results/report/curves/stage4.png").is_file()
