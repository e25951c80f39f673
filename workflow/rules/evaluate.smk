# Evaluation of every stage on the test split (three protocols, next to three baselines; research
# runs on val too) and the fixed protocol's cloud detection the evaluations and the viewer read.
# One evaluation rule per stage of the registry: evaluate_stage0, evaluate_stage1,
# evaluate_stage2, evaluate_stage3. Their input functions: runs.smk.


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
