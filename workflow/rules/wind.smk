# The wind-scanner cache: scan orders precomputed once, read from disk by every DDP rank.
# (Computing them in the first forward pass deadlocked DDP on 16 to 400 GPUs on LUMI.)


rule wind_cache:
    output:
        cache=PATTERN.wind_cache(),
    log:
        "logs/wind_cache{run}/wind_cache.log",
    benchmark:
        "benchmarks/wind_cache{run}/wind_cache.tsv"
    # One cache per wind setting: the first run with it makes it, the others read it.
    wildcard_constraints:
        run=get_makers("wind"),
    conda:
        "../../envs/vcloud.yaml"
    container:
        get_container("wind_cache")
    threads: get_resources("wind_cache")["threads"]
    resources:
        **get_slurm_resources("wind_cache"),
    params:
        grid_h=lambda wildcards: get_wind_grid(get_run_model_set(wildcards))[0],
        grid_w=lambda wildcards: get_wind_grid(get_run_model_set(wildcards))[1],
        sectors=lambda wildcards: get_run_model_set(wildcards).stage1.model.wind_sectors,
    shell:
        "vcloud wind-cache --out {output.cache} --grid-h {params.grid_h} --grid-w {params.grid_w}"
        " --sectors {params.sectors} > {log} 2>&1"


# Real wind for the real dataset or your own locations (data.source: folder): ERA5 u10/v10 for
# every location and date, from the public ARCO-ERA5 store (no account). A local rule: it needs
# the network (LUMI login node). prepare_roi takes the result as input when data.wind_table names
# it (config/lumi.yaml).
rule era5_wind:
    input:
        lambda wildcards: get_era5_input(),
    output:
        wind=directory(config["wind"]["era5_table"]),
    log:
        "logs/era5_wind/era5_wind.log",
    benchmark:
        "benchmarks/era5_wind/era5_wind.tsv"
    localrule: True
    conda:
        "../../envs/vcloud.yaml"
    container:
        get_container("wind_cache")
    threads: 1
    params:
        places=lambda wildcards: get_era5_flags(),
        source=(
            f"--source {config['wind']['era5_source']}"
            if config["wind"]["era5_source"]
            else ""
        ),
        times=get_times(),
        size=DATA["patch_size"],
    shell:
        "vcloud era5-wind {params.places} --out {output.wind} {params.source}"
        " --times {params.times} --size {params.size} > {log} 2>&1"
