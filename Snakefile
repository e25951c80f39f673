# vcloud: multi-temporal cloud removal on SEN12MS-CR-TS, from a laptop to LUMI.
# Laptop: `snakemake --cores all` (embedded default config, synthetic data, CPU).
from snakemake.utils import min_version

from vcloud.config import fill_defaults, fill_missing, validate_config
from vcloud.config.workflow import fill_stage_resources
from vcloud.runtime.site import apply_site

min_version("9.0")

# This repository, also when the workflow is used as a module from another directory
# (workflow.basedir is then the using workflow's folder).
VCLOUD_ROOT = workflow.current_basedir


configfile: f"{VCLOUD_ROOT}/config/config.yaml"


report: "workflow/report/workflow.rst"


# Used as a module, the caller's config holds only what it changes (snakemake ignores the
# configfile above then): the embedded defaults fill the rest.
fill_missing(config, f"{VCLOUD_ROOT}/config/config.yaml")
# A cluster run's site facts (config/sites/<cluster.site>.yaml) beneath its own cluster section.
apply_site(config, VCLOUD_ROOT)
# The stages' rules get their resources from the registry; the config's entries change them.
fill_stage_resources(config)
# One line naming the offending key, before any rule is built.
validate_config(config, f"{VCLOUD_ROOT}/workflow/schemas/config.schema.yaml")
fill_defaults(config, f"{VCLOUD_ROOT}/workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/sources.smk"
include: "workflow/rules/runs.smk"
include: "workflow/rules/outputs.smk"
include: "workflow/rules/predict_inputs.smk"
include: "workflow/rules/rehearsal_inputs.smk"
include: "workflow/rules/cluster.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/wind.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/export.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/predict.smk"
include: "workflow/rules/rehearsal.smk"


# On a cluster (config/lumi.yaml): `vcloud doctor` checks, warnings here, fatal at start.
warn_cluster_problems()


onstart:
    check_cluster()


rule all:
    default_target: True
    input:
        get_all_outputs()
        + get_predict_outputs()
        + get_rehearsal_outputs()
        + get_tracking_outputs(),
