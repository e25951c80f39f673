# The wind-scanner cache: scan orders precomputed once, read from disk by every DDP rank.
# (Computing them in the first forward pass deadlocked DDP on 16 to 400 GPUs on LUMI.)


rule wind_cache:
    output:
        cache=get_wind_cache(),
    log:
        "logs/wind_cache/wind_cache.log",
    benchmark:
        "benchmarks/wind_cache/wind_cache.tsv"
    conda:
        "../../envs/vcloud.yaml"
    container:
        get_container("wind_cache")
    threads: get_resources("wind_cache")["threads"]
    resources:
        **get_slurm_resources("wind_cache"),
    params:
        grid_h=lambda wildcards: get_wind_grid()[0],
        grid_w=lambda wildcards: get_wind_grid()[1],
        sectors=MODEL_SET.stage1.model.wind_sectors,
    shell:
        "vcloud wind-cache --out {output.cache} --grid-h {params.grid_h} --grid-w {params.grid_w}"
        " --sectors {params.sectors} > {log} 2>&1"
