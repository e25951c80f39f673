# vcloud predict (docs/predict.md): the predict.stage model applied to the cloudy dates of the
# predict.split ROIs, one job per ROI (an array of GPU jobs on LUMI, launched like the
# evaluations), each resumable from its manifest. Opt-in: `rule all` asks for it only with
# predict.enabled; `snakemake predict_all` makes it at any time.
PREDICT = config["predict"]


rule predict:
    input:
        unpack(get_predict_input),
    output:
        manifest=get_predict_manifest("{roi}"),
    log:
        "logs/predict/{roi}.log",
    benchmark:
        "benchmarks/predict/{roi}.tsv"
    retries: get_retries("predict")
    conda:
        "../../envs/vcloud.yaml"
    container:
        get_container("predict")
    threads: get_threads("predict")
    resources:
        **get_slurm_resources("predict"),
    params:
        env=lambda wildcards, resources: get_runtime_env_flags(),
        launch=lambda wildcards, resources: get_launch_prefix("predict"),
        stage=PREDICT["stage"],
        config=get_model_config(),
        settings=get_predict_flags(),
        checkpoints=lambda wildcards, input: get_checkpoint_flags(input),
        out=lambda wildcards, output: str(Path(output.manifest).parent),
    shell:
        "{params.launch} vcloud predict --stage {params.stage} --store {input.store} --out {params.out}"
        " {params.checkpoints} --config {params.config} {params.settings} {params.env} > {log} 2>&1"


rule predict_all:
    input:
        [get_predict_manifest(roi) for roi in get_predict_rois()],
