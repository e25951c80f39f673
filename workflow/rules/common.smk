# The shared base of every rules file: the settings (DATA, PATHS, RUN, FOLDER), the wildcards, the
# model config (MODEL_SET) and the runs (RUNS, RUN_PATHS, RESEARCH). The raw data's input functions:
# sources.smk; each run's paths and the stages' inputs: runs.smk; what `all` asks for: outputs.smk;
# SLURM and container wiring: cluster.smk.
import re
import shlex
from pathlib import Path

from vcloud.config import load_model_config
from vcloud.data.archive import check_data_config
from vcloud.config.experiments import is_research, plan_runs
from vcloud.data.locations import folder_source
from vcloud import workflow as logic
from vcloud.errors import ConfigError
from vcloud.paths import RunPaths

check_data_config(config)  # one line for old keys (data.raw_dir) before anything else
DATA = config["data"]
PATHS = config["paths"]
PREPARED = PATHS["prepared"]
RESULTS = PATHS["results"]
# Every path of the run under those two folders (src/vcloud/paths.py).
RUN = RunPaths(prepared=PREPARED, results=RESULTS)
# data.source: folder (docs/data.md, "Your own locations"): the locations, checked in one line.
try:
    FOLDER = folder_source(config)
except ConfigError as err:
    raise WorkflowError(str(err)) from None


def get_roi_pattern():
    """A ROI's file name: ROIsXXXX_NNN, or the name of one of your own locations."""
    if FOLDER:
        return "|".join(re.escape(location.name) for location in FOLDER.locations)
    return r"ROIs\d{4}_\d+"


wildcard_constraints:
    roi=get_roi_pattern(),
    split="train|val|test",
    archive=r"s[12]_[A-Za-z]+(_test)?\.tar\.gz",


def get_model_config():
    """config.model_config, relative to the working directory or else to this repository."""
    path = Path(config["model_config"])
    if not path.is_absolute() and not path.exists():
        path = Path(VCLOUD_ROOT) / path
    return str(path)


MODEL_SET = load_model_config(get_model_config())
# The runs: one per experiment and seed (config `experiments:`, `seeds:`), each under
# results/<experiment>/seed<k>/; without those keys one run, in results/ itself. Every run's paths
# name the run that makes each file it shares with earlier runs (docs/workflow.md).
try:
    RUNS = plan_runs(config, get_model_config())
    RUN_PATHS = logic.run_paths(
        RUNS, prepared=PREPARED, results=RESULTS, patch_size=DATA["patch_size"]
    )
except ConfigError as err:
    raise WorkflowError(str(err)) from None
RESEARCH = is_research(config)
