"""A site without host installs (Olivia): the profile, the controller's batch script and the
doctor for a run whose snakemake lives in the image (vcloud.runtime.image_run)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from vcloud.errors import ConfigError
from vcloud.runtime import image_run
from vcloud.runtime.cluster import Cluster
from vcloud.runtime.controller import controller_job, script
from vcloud.runtime.doctor import Report, check_container
from vcloud.runtime.profile import load_workflow_config, write_site_profile

REPO = Path(__file__).resolve().parents[2]


def olivia(**cluster) -> Cluster:
    config = load_workflow_config(REPO / "config" / "olivia.yaml")
    config["cluster"].update(account="nn1234k", **cluster)
    return Cluster.from_config(config)


@pytest.fixture
def clone(tmp_path):
    """The files `vcloud profile --site olivia` reads, in a folder of their own."""
    for part in ("config", "workflow/schemas"):
        shutil.copytree(REPO / part, tmp_path / part)
    for name in ("constraints.txt", "pyproject.toml"):
        shutil.copy2(REPO / name, tmp_path / name)
    return tmp_path


def test_the_olivia_profile_runs_no_container_of_its_own_and_starts_python_from_path(clone):
    lines = write_site_profile("olivia", clone)
    profile = yaml.safe_load((clone / "profiles/olivia/config.yaml").read_text())
    # The jobs' snakemake is in the image already: no per-rule container, no apptainer args.
    assert not {"software-deployment-method", "apptainer-args", "precommand"} & set(profile)
    # Without software deployment on the shared file system the plugin names `python`, found
    # on PATH (profiles/olivia/bin), not this interpreter's path.
    assert "software-deployment" not in profile["shared-fs-usage"] and "persistence" in profile["shared-fs-usage"]
    folder = clone / "profiles/olivia/bin"
    for name in ("python", "python3", "vcloud", "apptainer"):
        assert (folder / name).is_symlink() and (folder / name).resolve() == (folder / image_run.SCRIPT)
    text = (folder / image_run.SCRIPT).read_text()
    assert "aarch64) image=/cluster/projects/nnXXXXk/vcloud/pytorch-aarch64.sif" in text  # GPU nodes
    assert "*) image=/cluster/projects/nnXXXXk/vcloud/pytorch-x86_64.sif" in text  # CPU nodes, login
    assert "-B /run/munge" in text and "-B /usr/bin/sbatch" in text and "-B /cluster" in text
    assert f"here={folder.resolve()}" in text
    assert any("run in the image" in line for line in lines)
    # --check: current, then stale once the script differs from what the site file gives.
    write_site_profile("olivia", clone, check=True)
    (folder / image_run.SCRIPT).write_text(text.replace("-B /run/munge ", ""))
    with pytest.raises(ConfigError, match="vcloud-image: stale"):
        write_site_profile("olivia", clone, check=True)


def test_a_host_site_profile_is_unchanged():
    cluster = olivia(host_installs=True)
    from vcloud.runtime.profile import render

    profile = yaml.safe_load(render(cluster, source="config/olivia.yaml"))
    assert profile["software-deployment-method"] == "apptainer" and "shared-fs-usage" not in profile


def test_the_controller_script_starts_the_image_python():
    cluster = olivia()
    job = controller_job(cluster, runtime=120)
    here = Path("/cluster/projects/nn1234k/run/profiles/olivia/bin")
    text = script(job, workdir=Path("/w"), profile=Path("profiles/olivia"), snakemake_args=[], image_bin=here)
    lines = text.splitlines()
    assert f'export PATH={here}:"$PATH"' in lines
    assert lines[-1].startswith("exec python -m vcloud.runtime.controller run")
    assert lines.index(f'export PATH={here}:"$PATH"') < len(lines) - 1
    # A site with host installs: this interpreter, as before.
    plain = script(job, workdir=Path("/w"), profile=Path("profiles/saga"), snakemake_args=[])
    assert "export PATH" not in plain and "exec python " not in plain


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"slurm_binds": []}, "cluster.slurm_binds: empty, but Olivia runs snakemake from the image"),
        ({"images": {}}, "cluster.images: no aarch64 image for partition accel"),
    ],
)
def test_a_site_without_host_installs_needs_the_slurm_client_and_every_image(change, message):
    cluster = olivia(**change)
    with pytest.raises(ConfigError, match=message):
        image_run.script(cluster, Path("/x"))
    report = Report()
    check_container(cluster, None, None, report)
    assert len(report.errors) == 1 and message in report.errors[0]


def test_the_doctor_takes_no_apptainer_args_where_the_image_runs_snakemake():
    report = Report()
    check_container(olivia(), None, None, report)
    assert report.errors == []
    report = Report()  # the same site with host installs: the binds must be in the profile's args
    check_container(olivia(host_installs=True), None, None, report)
    assert any("bind /cluster missing" in e for e in report.errors)


def test_the_workflow_refuses_a_host_snakemake_or_a_container_per_rule_on_such_a_site():
    from vcloud.workflow import deployment_problems

    cluster = olivia()
    (line,) = deployment_problems([], cluster, in_image=False)
    assert "snakemake runs on the host" in line and "profiles/olivia/bin/vcloud submit" in line
    (line,) = deployment_problems(["apptainer"], cluster, in_image=True)
    assert "a container in a container" in line
    assert deployment_problems([], cluster, in_image=True) == []
    # A site with host installs: rules in the image through snakemake's apptainer, as before.
    assert deployment_problems(["apptainer"], olivia(host_installs=True)) == []
    assert "apptainer is not on" in deployment_problems([], olivia(host_installs=True))[0]


def test_the_image_must_carry_the_controllers_packages_at_their_floors(tmp_path):
    """Run in the image (as `profiles/<site>/bin/vcloud doctor` runs), each package of
    containers/requirements-controller.txt that is missing or older than its floor is named; on
    the host nothing is checked. This environment has them all (the test extra installs them)."""
    assert image_run.package_problems(REPO, inside=True) == []
    repo = tmp_path / "repo"
    (repo / "containers").mkdir(parents=True)
    lines = ["# a comment", "pytest>=7.0  # present and new enough", "", "pyyaml>=999.0", "no-such-package-x>=1.0"]
    (repo / image_run.REQUIREMENTS).write_text("\n".join(lines) + "\n")
    too_old, missing = image_run.package_problems(repo, inside=True)
    assert too_old.startswith("image: pyyaml is ") and ">=999.0 needed" in too_old
    assert missing.startswith("image: no-such-package-x is missing, >=1.0 needed") and image_run.REQUIREMENTS in missing
    assert image_run.package_problems(repo, inside=False) == []


def test_the_controller_requirements_keep_pyprojects_floors():
    """What the image needs where snakemake runs from it: snakemake, its SLURM plugin and the
    mlflow extra, at pyproject.toml's floors (a floor raised there is raised here)."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [d for d in project["dependencies"] if Requirement(d).name.startswith("snakemake")]
    wanted += project["optional-dependencies"]["mlflow"]
    lines = (REPO / image_run.REQUIREMENTS).read_text().splitlines()
    listed = [x.split("#")[0].strip() for x in lines if x.split("#")[0].strip()]
    assert sorted(map(str, map(Requirement, listed))) == sorted(map(str, map(Requirement, wanted)))


def test_the_doctor_names_a_package_the_image_lacks_before_anything_is_submitted(tmp_path, monkeypatch):
    """`vcloud doctor` (and the workflow's start, preflight) on a site without host installs,
    run in an image without the SLURM plugin: one line naming it. On the host it is not checked."""
    from vcloud.config import load_model_config
    from vcloud.runtime.doctor import preflight

    config = load_workflow_config(REPO / "config" / "olivia.yaml")
    config["cluster"].update(account="nn1234k")
    repo = tmp_path / "repo"
    (repo / "containers").mkdir(parents=True)
    (repo / image_run.REQUIREMENTS).write_text("snakemake-executor-plugin-nowhere>=2.7.1\n")
    model_set = load_model_config(REPO / config["model_config"])
    args = dict(apptainer_args=None, precommand=None, train_inputs={}, memory=False, repo=repo)

    def lacking(inside: bool) -> list[str]:
        monkeypatch.setattr(image_run, "in_image", lambda: inside)
        return [e for e in preflight(config, model_set, **args).errors if e.startswith("image: ")]

    (line,) = lacking(True)
    assert line.startswith("image: snakemake-executor-plugin-nowhere is missing, >=2.7.1 needed"), line
    assert lacking(False) == []
