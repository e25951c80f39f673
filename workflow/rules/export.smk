# The exports of the runs: the offline viewer (rule export_viewer; its input functions:
# outputs.smk) and the offline tracking's export to MLflow (rule export_mlflow).
from vcloud.export.tracking import tracking_flags, tracking_inputs


# The offline viewer: quicklooks of test samples through every stage, one static page. A research
# run has one, of compare's baseline under its first seed, with the comparison of every run on it.
rule export_viewer:
    input:
        **get_viewer_input(),
    output:
        page=RUN.viewer_page(),
        images=directory(f"{RESULTS}/viewer/images"),
        thumbnails=report(
            f"{RESULTS}/viewer/thumbnails.png",
            caption="../report/viewer.rst",
            category="Viewer",
        ),
    log:
        "logs/export_viewer/export_viewer.log",
    benchmark:
        "benchmarks/export_viewer/export_viewer.tsv"
    conda:
        "../../envs/vcloud.yaml"
    container:
        get_container("export_viewer")
    threads: get_threads("export_viewer")
    resources:
        **get_slurm_resources("export_viewer"),
    params:
        config=get_viewer_model_config(),
        checkpoints=lambda wildcards, input: get_checkpoint_flags(input),
        out=lambda wildcards, output: str(Path(output.page).parent),
        samples=config["viewer"]["samples"],
        seed=config["viewer"]["seed"],
        # A function of input (not a rerun trigger of its own; the inputs are): empty for a single run.
        comparison=lambda wildcards, input: get_viewer_comparison_flags(input),
    shell:
        "vcloud export-viewer --store {input.store} {params.checkpoints}"
        " --config {params.config} --out {params.out} --samples {params.samples}"
        " --seed {params.seed} --fixed-protocol {input.fixed_protocol}{params.comparison} > {log} 2>&1"


# Offline tracking (config tracking.mlflow; docs/evaluation.md, "Tracking in MLflow"): every run's
# resolved config, per-epoch metrics and scores in one MLflow SQLite database. A local rule with no
# container: the controller's process is its one writer, and its Python needs the mlflow extra.
localrules:
    export_mlflow,


rule export_mlflow:
    input:
        # Every run's curves, evaluations and model config (a shared one once): it runs after them.
        tracking_inputs(RUN_PATHS, research=RESEARCH),
    output:
        # Brought up to date in place (update: snakemake keeps it, and restores it if the job fails):
        # the MLflow runs keep their ids from one export to the next.
        db=update(f"{RESULTS}/mlflow.db"),
    log:
        "logs/export_mlflow/export_mlflow.log",
    benchmark:
        "benchmarks/export_mlflow/export_mlflow.tsv"
    conda:
        "../../envs/mlflow.yaml"
    params:
        results=lambda wildcards, output: str(Path(output.db).parent),
        runs=tracking_flags(
            RUNS, RUN_PATHS, model_config=None if RESEARCH else get_model_config()
        ),
    shell:
        "vcloud export-mlflow --db {output.db} --results {params.results:q} {params.runs} > {log} 2>&1"
