# The four training stages (rules train_stage0..3), of each run (the {run} wildcard, runs.smk); each resumes from its latest.pt, also when
# snakemake deleted best.pt (a finished stage then trains nothing), and starts fresh when a
# setting it depends on changed (the config_hash param; upstream weights: the trainer) or when
# latest.pt was moved aside (docs/resume.md). One rule per stage of the registry
# (src/vcloud/registry.py): train_stage0, train_stage1, train_stage2, train_stage3.

for stage in STAGE_NUMBERS:

    rule:
        name:
            f"train_stage{stage}"
        input:
            unpack(get_train_input(stage)),
        output:
            best=PATTERN.checkpoint(stage),
            # Rewritten from latest.pt at every start, so deleting it with an incomplete job
            # loses nothing (vcloud/train/records.py).
            metrics=PATTERN.metrics_log(stage),
        log:
            f"logs/train_stage{stage}{{run}}/train_stage{stage}.log",
        benchmark:
            f"benchmarks/train_stage{stage}{{run}}/train_stage{stage}.tsv"
        # Only the run that makes the stage: another run of the same identity reads its files.
        wildcard_constraints:
            run=get_makers(f"stage{stage}"),
        priority: logic.train_priority(stage)
        # Each job trains until its wall time warns it (SIGUSR1, exit 3); snakemake
        # resubmits it, and the trainer resumes from latest.pt (see get_retries).
        retries: get_retries(f"train_stage{stage}")
        conda:
            "../../envs/vcloud.yaml"
        container:
            get_container(f"train_stage{stage}")
        threads: get_threads(f"train_stage{stage}")
        resources:
            **get_slurm_resources(f"train_stage{stage}"),
        params:
            stage=stage,
            config=get_run_model_config,
            out=lambda wildcards, output: str(Path(output.best).parent),
            upstream=lambda wildcards, input: get_checkpoint_flags(input),
            config_hash=get_stage_hash(stage),
            # Functions of resources: how a job is launched is not a rerun trigger (params are).
            env=lambda wildcards, resources: get_runtime_env_flags(),
            launch=lambda wildcards, resources, stage=stage: get_launch_prefix(
                f"train_stage{stage}"
            ),
        shell:
            "{params.launch} vcloud train --stage {params.stage} --config {params.config}"
            " --train {input.train} --val {input.val} --out {params.out}"
            " {params.upstream} {params.env} > {log} 2>&1"


# A research run's model config: the model config with its experiment's and seed's changes
# (config experiments:, seeds:), written whole; its stages train and are scored with it.
localrules:
    run_config,


rule run_config:
    output:
        config=PATTERN.run_model_config(),
    log:
        "logs/run_config{run}/run_config.log",
    wildcard_constraints:
        run=get_research_runs(),
    conda:
        "../../envs/vcloud.yaml"
    # A second of work where snakemake runs, in the image of the report's local rules.
    container:
        get_container("report_tables")
    params:
        base=get_model_config(),
        changes=get_run_changes,
    shell:
        "vcloud run-config --config {params.base} --changes {params.changes:q}"
        " --out {output.config} > {log} 2>&1"
