# Raw SEN12MS-CR-TS (or its synthetic stand-in) -> per-ROI zarr stores -> split stores.
# Downloaded archives are read in place: indexed once each (index_archive), then every
# prepare_roi job decompresses only its own members. With data.source: folder every location
# (a sub-folder of data.folder) is prepared as one ROI, and the splits assemble them; with
# data.temporal_split each split store takes every location and keeps the split's dates only.

from vcloud.data.s2files import prepare_flags
from vcloud.data.splits import split_date_flags, split_location_store


rule synth_raw:
    output:
        **get_synthetic_outputs(),
    log:
        "logs/synth_raw/synth_raw.log",
    benchmark:
        "benchmarks/synth_raw/synth_raw.tsv"
    conda:
        "../../envs/vcloud.yaml"
    container:
        get_container("synth_raw")
    threads: get_resources("synth_raw")["threads"]
    resources:
        **get_slurm_resources("synth_raw"),
    params:
        rois=" ".join(f"--roi {roi}" for roi in config["synthetic"]["rois"]),
        patches=config["synthetic"]["patches"],
        times=DATA["times"],
        size=DATA["patch_size"],
        seed=config["synthetic"]["seed"],
        out=lambda wildcards, output: get_synthetic_root(output),
        archives="--archives" if config["synthetic"]["archives"] else "",
    shell:
        "vcloud synth --out {params.out} {params.rois} --patches {params.patches}"
        " --times {params.times} --size {params.size} --seed {params.seed}"
        " {params.archives} > {log} 2>&1"


rule index_archive:
    input:
        archive=get_archive,
    output:
        index=f"{get_index_dir()}/{{archive}}.vcloud-index",
    log:
        "logs/index_archive/{archive}.log",
    benchmark:
        "benchmarks/index_archive/{archive}.tsv"
    conda:
        "../../envs/vcloud.yaml"
    container:
        get_container("index_archive")
    threads: get_threads("index_archive")
    resources:
        **get_slurm_resources("index_archive"),
    params:
        index_dir=lambda wildcards, output: Path(output.index).parent,
    shell:
        "vcloud index --rebuild --index-dir {params.index_dir} {input.archive} > {log} 2>&1"


rule prepare_roi:
    input:
        unpack(get_prepare_input),
        unpack(get_wind_input),
    output:
        store=directory(f"{PREPARED}/rois/{{roi}}.zarr"),
        bad=f"{PREPARED}/rois/{{roi}}.bad.tsv",
    log:
        "logs/prepare_roi/{roi}.log",
    benchmark:
        "benchmarks/prepare_roi/{roi}.tsv"
    conda:
        "../../envs/vcloud.yaml"
    container:
        get_container("prepare_roi")
    threads: get_resources("prepare_roi")["threads"]
    resources:
        **get_slurm_resources("prepare_roi"),
    params:
        raw=get_prepare_raw_flags,
        index_dir=get_index_dir(),
        roi=get_roi_id,
        policy=DATA["on_bad_image"],
        times=get_times(),
        size=DATA["patch_size"],
        wind=f"--wind {get_wind_table()}" if get_wind_table() else "",
        clouds=" ".join(
            f"--{key.replace('_', '-')} {value}"
            for key, value in DATA["cloud_classes"].items()
        ),
        scl=" ".join(
            f"--scl {code}={prob}"
            for code, prob in DATA.get("scl_cloud_prob", {}).items()
        ),
        s1_window=(
            f"--s1-max-days {DATA['s1_max_days']}" if "s1_max_days" in DATA else ""
        ),
        s2=prepare_flags(DATA),
    shell:
        "vcloud prepare {params.raw} --index-dir {params.index_dir} --roi {params.roi}"
        " --out {output.store} --threads {threads} --on-bad-image {params.policy}"
        " --times {params.times} --size {params.size} {params.wind} {params.clouds}"
        " {params.scl} {params.s1_window} {params.s2} > {log} 2>&1"


rule assemble_split:
    input:
        lambda wildcards: [
            get_prepared_roi(roi) for roi in get_split_rois(wildcards.split)
        ],
    output:
        store=directory(f"{PREPARED}/{{split}}.zarr"),
    log:
        "logs/assemble_split/{split}.log",
    benchmark:
        "benchmarks/assemble_split/{split}.tsv"
    conda:
        "../../envs/vcloud.yaml"
    container:
        get_container("assemble_split")
    threads: get_resources("assemble_split")["threads"]
    resources:
        **get_slurm_resources("assemble_split"),
    params:
        dates=lambda wildcards: split_date_flags(FOLDER, wildcards.split),
    shell:
        "vcloud assemble --out {output.store}{params.dates} {input} > {log} 2>&1"


# data.temporal_split: one location's store of one split's dates, what predict reads (the dates
# of predict.split only). Booked, logged and resourced as assemble_split's jobs.
rule split_location:
    input:
        RUN.roi_store("{roi}"),
    output:
        store=directory(split_location_store(PREPARED, "{split}", "{roi}")),
    log:
        "logs/assemble_split/{split}/{roi}.log",
    benchmark:
        "benchmarks/assemble_split/{split}/{roi}.tsv"
    conda:
        "../../envs/vcloud.yaml"
    container:
        get_container("assemble_split")
    threads: get_resources("assemble_split")["threads"]
    resources:
        **get_slurm_resources("assemble_split"),
    params:
        dates=lambda wildcards: split_date_flags(FOLDER, wildcards.split),
    shell:
        "vcloud assemble --out {output.store}{params.dates} {input} > {log} 2>&1"
