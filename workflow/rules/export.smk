# Evaluation of every stage on the test split (two protocols, next to two baselines).

for stage in range(4):

    rule:
        name:
            f"evaluate_stage{stage}"
        input:
            **get_evaluate_input(stage),
        output:
            report=f"{RESULTS}/eval/stage{stage}.json",
        log:
            f"logs/evaluate_stage{stage}/evaluate_stage{stage}.log",
        benchmark:
            f"benchmarks/evaluate_stage{stage}/evaluate_stage{stage}.tsv"
        conda:
            "../../envs/vcloud.yaml"
        container:
            get_container("evaluate")
        threads: get_resources("evaluate")["threads"]
        resources:
            **get_slurm_resources("evaluate"),
        params:
            # Functions of resources: how a job is launched is not a rerun trigger (params are).
            env=lambda wildcards, resources: get_runtime_env_flags(),
            stage=stage,
            config=get_model_config(),
            results=lambda wildcards, output: str(Path(output.report).parent.parent),
            wind=lambda wildcards, input: (
                f"--wind-cache {input.wind_cache}"
                if "wind_cache" in input.keys()
                else ""
            ),
        shell:
            "vcloud evaluate --stage {params.stage} --store {input.store} --out {output.report}"
            " --results {params.results} --config {params.config} {params.wind}"
            " {params.env} > {log} 2>&1"
