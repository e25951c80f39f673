# vcloud predict (docs/predict.md): the predict.stage model applied to the cloudy dates of the
# predict.split ROIs, one job per ROI (an array of GPU jobs on LUMI, launched like the
# evaluations), each resumable from its manifest. Opt-in: `rule all` asks for it only with
# predict.enabled; `snakemake predict_all` makes it at any time.
# The input functions and PREDICT (config predict:): predict_inputs.smk.


rule predict:
    input:
        unpack(get_predict_input),
    output:
        manifest=RUN.predict_manifest(PREDICT["stage"], "{roi}"),
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
        [RUN.predict_manifest(PREDICT["stage"], roi) for roi in get_predict_rois()],


# vcloud bundle (docs/predict.md): the finished run's model as one file to share and to predict
# with (`vcloud predict --bundle`). Part of the default target; seconds of copying and hashing, so
# on a cluster it runs where snakemake runs.
localrules:
    bundle,


rule bundle:
    input:
        **get_bundle_input(),
    output:
        bundle=RUN.bundle(MODEL_SET.name),
    log:
        "logs/bundle/bundle.log",
    benchmark:
        "benchmarks/bundle/bundle.tsv"
    conda:
        "../../envs/vcloud.yaml"
    container:
        get_container("bundle")
    threads: get_threads("bundle")
    resources:
        **get_slurm_resources("bundle"),
    params:
        stages=get_bundle_stage_flags(),
        config=get_model_config(),
        checkpoints=lambda wildcards, input: get_checkpoint_flags(input),
    shell:
        "vcloud bundle {params.stages} {params.checkpoints} --config {params.config}"
        " --train-store {input.store} --eval {input.reports} --out {output.bundle} > {log} 2>&1"
