# The rehearsal's own rules (config/rehearsal.yaml sets rehearsal.enabled): the transport step
# on every GPU of a node (RCCL/NCCL over the site's network) and the closing summary. The rehearsal's training rules are
# the real ones; resources.<rule>.rehearse_warning forces a wall-time warning on one of them.
# With experiments and seeds the rehearsal tries one run of the grid, RUNS' only one
# (vcloud.config.experiments.rehearsed_run), its files where a single run's lie (the input
# functions: rehearsal_inputs.smk).


if is_rehearsal():

    rule rehearse_transport:
        output:
            report=RUN.transport_report(),
        log:
            "logs/rehearse_transport/rehearse_transport.log",
        benchmark:
            "benchmarks/rehearse_transport/rehearse_transport.tsv"
        retries: 0
        container:
            get_container("rehearse_transport")
        threads: get_threads("rehearse_transport")
        resources:
            **get_slurm_resources("rehearse_transport"),
        params:
            launch=get_launch_prefix("rehearse_transport"),
            logs="logs/rehearse_transport/rccl",
            env=lambda wildcards: get_runtime_env_flags(),
            expect=(
                config["cluster"].get("transport", "cxi")
                if config.get("cluster")
                else "cxi"
            ),
        shell:
            "{params.launch} vcloud rccl-check --log-dir {params.logs} --expect {params.expect}"
            " --out {output.report} {params.env} > {log} 2>&1"

    rule rehearsal_summary:
        input:
            unpack(get_rehearsed_input),
        output:
            summary=config["rehearsal"]["summary"],
        log:
            "logs/rehearsal_summary/rehearsal_summary.log",
        localrule: True
        container:
            get_container("rehearsal_summary")
        threads: 1
        params:
            results=RESULTS,
            config=get_rehearsed_model_config(),
            run=get_rehearsed_run_flags(),
            full=get_full_model_config(),
            transport=lambda wildcards, input: (
                f"--transport {input.transport}" if "transport" in input.keys() else ""
            ),
            # AMD sites only: an empty --miopen-cache '' is no argument at all to the shell.
            miopen=lambda wildcards: (
                f"--miopen-cache {shlex.quote(config['runtime_env']['MIOPEN_USER_DB_PATH'])}"
                if config["runtime_env"].get("MIOPEN_USER_DB_PATH")
                else ""
            ),
        shell:
            "vcloud rehearsal-summary --results {params.results} --logs logs --config {params.config}"
            " --full-config {params.full} --train-store {input.train} {params.transport}"
            " {params.miopen} {params.run} --out {output.summary} > {log} 2>&1"
