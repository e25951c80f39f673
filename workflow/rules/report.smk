# The run report (`snakemake --report report.html`): training curves, evaluation and stage
# tables, the comparison of research runs (rule compare) and the accounting. Their input
# functions: outputs.smk.


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
