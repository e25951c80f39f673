# Evaluation of every stage on the test split (three protocols, next to three baselines; research
# runs on val too), the offline viewer and the run report's figures and tables. One evaluation
# rule per stage of the registry: evaluate_stage0, evaluate_stage1, evaluate_stage2, evaluate_stage3.
# The offline tracking's export to MLflow (rule export_mlflow) closes it.
from vcloud.export.tracking import tracking_flags, tracking_inputs


# The fixed protocol's cloud detection (s2cloudless on every synthetic-clouded target), done once
# on all the rule's threads: every evaluate_stage<n> and export_viewer read it instead of detecting.
rule fixed_protocol:
    input:
        unpack(get_fixed_protocol_input),
    output:
        detected=get_scored(PATTERN.fixed_protocol()),
    log:
        "logs/fixed_protocol{run}/fixed_protocol{scored}.log",
    benchmark:
        "benchmarks/fixed_protocol{run}/fixed_protocol{scored}.tsv"
    # One detection per fixed-protocol setting and split: the first run with it makes it, the
    # others read it.
    wildcard_constraints:
        run=get_makers("fixed_protocol"),
        scored=get_scored_splits(),
    conda:
        "../../envs/vcloud.yaml"
    container:
        get_container("fixed_protocol")
    threads: get_threads("fixed_protocol")
    resources:
        **get_slurm_resources("fixed_protocol"),
    params:
        config=get_run_model_config,
        settings=get_fixed_protocol_hash,
    shell:
        "vcloud fixed-protocol --store {input.store} --config {params.config} --out {output.detected}"
        " --threads {threads} > {log} 2>&1"


for stage in STAGE_NUMBERS:

    rule:
        name:
            f"evaluate_stage{stage}"
        input:
            unpack(get_evaluate_input(stage)),
        output:
            report=get_scored(PATTERN.eval_report(stage)),
        log:
            f"logs/evaluate_stage{stage}{{run}}/evaluate_stage{stage}{{scored}}.log",
        benchmark:
            f"benchmarks/evaluate_stage{stage}{{run}}/evaluate_stage{stage}{{scored}}.tsv"
        # Only the run that makes the evaluation: another with the same stages reads its report.
        # Research runs score val too ({scored} ".val"), where their designs are chosen.
        wildcard_constraints:
            run=get_makers(f"eval{stage}"),
            scored=get_scored_splits(),
        retries: get_retries(f"evaluate_stage{stage}")
        conda:
            "../../envs/vcloud.yaml"
        container:
            get_container(f"evaluate_stage{stage}")
        threads: get_threads(f"evaluate_stage{stage}")
        resources:
            **get_slurm_resources(f"evaluate_stage{stage}"),
        params:
            # Functions of resources: how a job is launched is not a rerun trigger (params are).
            env=lambda wildcards, resources: get_runtime_env_flags(),
            launch=lambda wildcards, resources, stage=stage: get_launch_prefix(
                f"evaluate_stage{stage}"
            ),
            stage=stage,
            config=get_run_model_config,
            evaluation=get_evaluation_hash,
            checkpoints=lambda wildcards, input: get_checkpoint_flags(input),
        shell:
            "{params.launch} vcloud evaluate --stage {params.stage} --store {input.store} --out {output.report}"
            " {params.checkpoints} --config {params.config} --fixed-protocol {input.fixed_protocol}"
            " {params.env} > {log} 2>&1"


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


# Run report (`snakemake --report report.html`): training curves, evaluation tables, accounting.
# Seconds of work each: on a cluster they run where snakemake runs, not as queued jobs.
localrules:
    report_curves,
    report_tables,
    accounting,


rule report_curves:
    input:
        metrics=[RUN.metrics_log(stage) for stage in STAGE_NUMBERS],
    output:
        [
            report(
                RUN.curves(stage),
                caption="../report/curves.rst",
                category="Training",
                labels={"stage": str(stage)},
            )
            for stage in STAGE_NUMBERS
        ],
    log:
        "logs/report_curves/report_curves.log",
    benchmark:
        "benchmarks/report_curves/report_curves.tsv"
    conda:
        "../../envs/vcloud.yaml"
    container:
        get_container("report_curves")
    threads: get_threads("report_curves")
    resources:
        **get_slurm_resources("report_curves"),
    shell:
        "vcloud plot-curves --out {output} --metrics {input.metrics} > {log} 2>&1"


rule report_tables:
    input:
        reports=get_stage_tables_input,
    output:
        page=report(
            PATTERN.report_file("evaluation.html"),
            caption="../report/evaluation.rst",
            category="Evaluation",
        ),
        stages=PATTERN.stage_comparison(),
        stages_md=PATTERN.stage_comparison("md"),
    log:
        "logs/report_tables{run}/report_tables.log",
    benchmark:
        "benchmarks/report_tables{run}/report_tables.tsv"
    wildcard_constraints:
        run=get_all_runs(),
    conda:
        "../../envs/vcloud.yaml"
    container:
        get_container("report_tables")
    threads: get_threads("report_tables")
    resources:
        **get_slurm_resources("report_tables"),
    shell:
        "(vcloud report-tables --out {output.page} {input.reports}"
        " && vcloud compare-stages --out {output.stages} --markdown {output.stages_md} {input.reports}) > {log} 2>&1"


# Research runs (config experiments:, seeds:): each experiment against the baseline, over seeds,
# sample by sample (vcloud compare; docs/evaluation.md, "Experiments compared").
localrules:
    compare,


rule compare:
    input:
        reports=list(
            dict.fromkeys(
                path
                for split in ("val", "test")
                for run, path in get_compare_reports(split)
            )
        ),
    output:
        comparison=RUN.comparison(),
        markdown=report(
            RUN.comparison("md"),
            caption="../report/compare.rst",
            category="Experiments",
        ),
    log:
        "logs/compare/compare.log",
    benchmark:
        "benchmarks/compare/compare.tsv"
    conda:
        "../../envs/vcloud.yaml"
    container:
        get_container("report_tables")
    params:
        reports=get_compare_flags(),
    shell:
        "vcloud compare --out {output.comparison} --markdown {output.markdown}"
        " {params.reports} > {log} 2>&1"


rule accounting:
    input:
        get_accounting_input(),
    output:
        tsv=RUN.report_file("accounting.tsv"),
        page=report(
            RUN.report_file("accounting.html"),
            caption="../report/accounting.rst",
            category="Accounting",
        ),
    log:
        "logs/accounting/accounting.log",
    benchmark:
        "benchmarks/accounting/accounting.tsv"
    conda:
        "../../envs/vcloud.yaml"
    container:
        get_container("accounting")
    threads: get_threads("accounting")
    resources:
        **get_slurm_resources("accounting"),
    params:
        benchmarks="benchmarks",
        resources=get_resources_json(),
    shell:
        "vcloud accounting --benchmarks {params.benchmarks} --resources {params.resources:q}"
        " --tsv {output.tsv} --html {output.page} > {log} 2>&1"


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
