# The four training stages (rules train_stage0..3); each resumes from its latest.pt when a job
# was interrupted, and starts fresh when its best.pt was deleted (snakemake -R) or a setting
# it depends on changed (the config_hash param).

for stage in range(4):

    rule:
        name:
            f"train_stage{stage}"
        input:
            **get_train_input(stage),
        output:
            best=get_checkpoint(stage),
        log:
            f"logs/train_stage{stage}/train_stage{stage}.log",
        benchmark:
            f"benchmarks/train_stage{stage}/train_stage{stage}.tsv"
        conda:
            "../../envs/vcloud.yaml"
        threads: get_resources(f"train_stage{stage}")["threads"]
        resources:
            runtime=get_resources(f"train_stage{stage}")["runtime"],
            mem_mb=get_resources(f"train_stage{stage}")["mem_mb"],
        params:
            stage=stage,
            config=get_model_config(),
            out=lambda wildcards, output: str(Path(output.best).parent),
            upstream=lambda wildcards, input: get_upstream_flags(input),
            config_hash=get_stage_hash(stage),
        shell:
            "vcloud train --stage {params.stage} --config {params.config}"
            " --train {input.train} --val {input.val} --out {params.out}"
            " {params.upstream} > {log} 2>&1"
