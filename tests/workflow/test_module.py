"""The workflow used as a snakemake `module` from another directory (the catalog convention)."""

import textwrap

import pytest
import yaml

from tests.workflow.snakemake_run import ROOT, SMALL, run

pytestmark = pytest.mark.workflow


def _using_workflow(tmp_path):
    """A project elsewhere that imports every vcloud rule under a prefix, with its own config."""
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(SMALL))
    (tmp_path / "Snakefile").write_text(
        textwrap.dedent(
            f"""\
            configfile: "config.yaml"


            module vcloud:
                snakefile:
                    "{ROOT / "Snakefile"}"
                config:
                    config


            use rule * from vcloud as vcloud_*


            rule all:
                default_target: True
                input:
                    rules.vcloud_all.input,
            """
        )
    )


def test_module_plans_every_rule_under_its_prefix(tmp_path):
    _using_workflow(tmp_path)
    proc = run(["-n", "--cores", "1", "-s", str(tmp_path / "Snakefile")], cwd=tmp_path)
    text = proc.stdout + proc.stderr
    for rule in ("synth_raw", "prepare_roi", "train_stage1", "train_stage3", "evaluate_stage2", "export_viewer"):
        assert f"vcloud_{rule}" in text, text[-2000:]
    assert "results/stage0/best.pt" in text


def test_module_runs_a_rule_from_the_other_directory(tmp_path):
    """Config, schema and model config are found in this repository, outputs land in the caller's."""
    _using_workflow(tmp_path)
    run(["--cores", "1", "-s", str(tmp_path / "Snakefile"), "--until", "vcloud_synth_raw"], cwd=tmp_path)
    synth = tmp_path / "resources" / "sen12mscrts_synth"
    assert synth.is_dir() and any(synth.rglob("*"))
