#!/usr/bin/env bash
# Bring up a real single-node SLURM cluster on this machine, for tests and CI.
#
#   cluster-up.sh            configure, start, verify; exit 0 when up. The packages come from
#                            tests/system-packages.sh (run it once, as root).
#                            Idempotent: when everything is already up it only re-checks
#                            (~0.3 s, no jobs) and exits 0.
#   cluster-up.sh --check    verify a running cluster with real jobs (srun, sbatch + sacct).
#   cluster-up.sh --down     stop every daemon this script starts (slurmd, slurmctld,
#                            slurmdbd, mariadb, munged; the site cluster's too).
#   cluster-up.sh --variant NAME [--check | --down]
#                            a second cluster, "vcloud-site", shaped like another site (below),
#                            beside the default one, which it leaves alone: its own slurmctld and
#                            slurmd (ports 6827, 6828), config in /etc/slurm-site (clients:
#                            SLURM_CONF=/etc/slurm-site/slurm.conf), the same munge, mariadb and
#                            slurmdbd. Switching variant rewrites its slurm.conf and restarts its
#                            two daemons, then runs the job checks (~8 s). --check checks it as
#                            that variant; --down stops its two daemons only.
#
# The cluster looks like LUMI from a job's point of view: partitions small (default),
# small-g, standard-g and dev-g on one node, one fake GPU (gres gpu:1 backed by
# /dev/null), accounts project_465000000 and vcloud_test, and accounting through
# slurmdbd + mariadb so that `sacct` works.
#
# Variants (tests/slurm/README.md), on the site cluster: the node is declared bigger than the
# machine (SlurmdParameters=config_overrides) so that a site's real requests can be evaluated
# (sbatch --test-only, held jobs); nothing is enforced, so small jobs still run. Each adds
# the site's example account (nn1234k, pl0123-01, project_465000123) to the two above.
#   sigma2     Saga's partitions normal (default), a100 and accel, and Betzy's preproc, with
#              Saga's (Betzy's) TRESBillingWeights and PriorityFlags=MAX_TRES; select/cons_tres,
#              128 CPUs, 1000000 MB, 4 typed GPUs (gpu:a100:4, fake device files); the QOS
#              devel (MaxWall 2 h, 2 running jobs per user, DenyOnLimit) enforced
#              (AccountingStorageEnforce=limits,qos).
#   gres-only  Eagle's partitions fast (default, 1 h) and proxima; select/cons_res, on which
#              sbatch refuses --gpus, --gpus-per-task and --cpus-per-gpu ("Requested GRES
#              option unsupported by configured SelectType plugin"; --gpus-per-node passes,
#              stored as a per-node GRES): GPUs as --gres=gpu:h100:N; 64 CPUs, 512000 MB,
#              4 typed GPUs (gpu:h100:4).
#   lumi       the default's partitions on a LUMI-sized node: 128 CPUs, 491520 MB, 8 typed
#              GPUs (gpu:mi250:8); standard-g allocates whole nodes.
# Every variant sets EnforcePartLimits=ALL: a job over its partition's time limit is refused at
# submission, as on the sites (the default lets it pend).
#
# Exit codes: 0 up / checked / stopped; 1 failure (one line "cluster-up: ..." on stderr
# saying what and which log to read); 77 this machine cannot host it (not root, or the
# packages are missing), which pytest fixtures turn into a skip (a failure when CI=true).
#
# Made for Debian 12 (slurm-wlm 22.05) as root without systemd: every daemon is started
# by hand, detached from the caller (setsid, stdio to log files) so that a caller that
# captures our output (subprocess.run(capture_output=True)) is never kept waiting.
set -Eeuo pipefail

PROG=cluster-up
CLUSTER=vcloud
ACCOUNTS=(project_465000000 vcloud_test)
PARTITIONS=(small small-g standard-g dev-g)

CONF_DIR=/etc/slurm # slurm.conf and gres.conf of the cluster (the site cluster's: /etc/slurm-site)
DBD_CONF_DIR=/etc/slurm # slurmdbd.conf: one slurmdbd serves both clusters
LOG_DIR=/var/log/slurm
RUN_DIR=/run/slurm
CTLD_SPOOL=/var/spool/slurmctld
SLURMD_SPOOL=/var/spool/slurmd
MARIADB_CNF=/etc/mysql/mariadb.conf.d/99-vcloud-slurmdbd.cnf
LOCK_FILE=/run/lock/vcloud-cluster-up.lock

DB_NAME=slurm_acct_db
DB_USER=slurm
DB_PASS=vcloud-slurmdbd # test-only cluster; mariadb listens on localhost only

NEEDED_BINARIES=(munged munge unmunge mysqld_safe mysqladmin mysql slurmctld slurmd slurmdbd
    sinfo srun sbatch sacct sacctmgr scontrol pgrep)

TIMEOUT=${CLUSTER_UP_TIMEOUT:-60} # seconds to wait for each daemon
# Optional: advertise a bigger node than the machine (e.g. CLUSTER_UP_CPUS=16
# CLUSTER_UP_MEM_MB=65536) so LUMI-sized requests can run instead of pending forever
# with reason PartitionConfig. Nothing is enforced (no cgroups), so tiny test jobs are
# fine. Every caller must pass the same values: a change rewrites slurm.conf and
# restarts slurmctld and slurmd.
FAKE_CPUS=${CLUSTER_UP_CPUS:-}
FAKE_MEM_MB=${CLUSTER_UP_MEM_MB:-}
DAEMON_PATH=/usr/sbin:/usr/bin:/sbin:/bin

# The site cluster (--variant): a second cluster beside the default one, with its own name,
# ports, config, state, pid and log files, so that switching variants never touches the default
# cluster or the jobs on it. Its daemons run with SLURM_CONF=$SITE_CONF_DIR/slurm.conf, which
# tells them apart from the default's (daemon_pid); clients reach it with the same variable.
SITE_CONF_DIR=/etc/slurm-site
SITE_CTLD_PORT=6827
SITE_SLURMD_PORT=6828
SFX="" # "-site" on the site cluster: the names of its pid, log and stamp files
INSTANCE_CONF="" # the SLURM_CONF its slurmctld and slurmd run with ("" for the default's)

ROOT_ACCOUNTS="" # root's accounts per sacctmgr, set by slurmdbd_ok
ROOT_ASSOCS="" # root's associations as account|qos lines, set by slurmdbd_ok
STARTED=0 # set to 1 when this run (re)started anything -> run the full job check

# ---------------------------------------------------------------------------- variants

VARIANTS=(default sigma2 gres-only lumi)
VARIANT=default
# What a variant changes; the defaults below are today's cluster (slurm.conf unchanged).
SHAPE=LUMI              # slurm.conf's header: "shaped like ..."
SELECT_TYPE=select/cons_tres
NODE_GRES=gpu:1         # the node's Gres=
GPU_TYPE=""             # typed GPUs: one fake device file each under $FAKE_GPU_DIR
GPU_COUNT=1
VARIANT_CPUS=""         # a declared node instead of the machine's (config_overrides)
VARIANT_MEM_MB=""
VARIANT_CONF=""         # more slurm.conf lines (priority, enforcement)
QOS_SPECS=()            # "name limit=value ..." for sacctmgr add/modify qos
CHECK_CPU_PART=small    # the job checks' partitions and GPU option
CHECK_GPU_PART=small-g
CHECK_GPU_OPT=--gpus=1
FAKE_GPU_DIR=/var/lib/vcloud-cluster-up/fake-gpu
PARTITION_LINES=""

# A site refuses a job over its partition's limits at submission (sbatch, and --test-only); the
# default lets it pend (reason PartitionTimeLimit).
ENFORCE_PART="# Jobs over a partition's limits are refused at submission, as on the sites.
EnforcePartLimits=ALL"

# set_variant NAME: what the variant changes (the default: nothing). sigma2's partitions carry
# Saga's billing weights (config/sites/saga.yaml partitions.<p>.billing_weights, from
# documentation.sigma2.no, jobs/projects_accounting; "G": per GiB of --mem), Betzy's on preproc;
# a name that several sites share has the shortest MaxTime among them (accel: Betzy's and
# Olivia's 7 days, Saga's is 14), so a job that passes here passes on each of them.
# tests/slurm/test_site_variants.py checks these lines against config/sites/*.yaml.
set_variant() {
    VARIANT=$1
    [[ $VARIANT == default ]] || site_cluster
    case $VARIANT in
    default)
        unset SLURM_CONF # the clients below talk to the default cluster
        PARTITION_LINES="PartitionName=small      Nodes=@HOST@ Default=YES MaxTime=3-00:00:00 State=UP
PartitionName=small-g    Nodes=@HOST@ MaxTime=3-00:00:00 State=UP
PartitionName=standard-g Nodes=@HOST@ MaxTime=2-00:00:00 State=UP
PartitionName=dev-g      Nodes=@HOST@ MaxTime=03:00:00 State=UP"
        ;;
    sigma2)
        SHAPE="Saga, Betzy and Olivia (variant sigma2)"
        PARTITIONS=(normal a100 accel preproc)
        NODE_GRES=gpu:a100:4 GPU_TYPE=a100 GPU_COUNT=4
        VARIANT_CPUS=128 VARIANT_MEM_MB=1000000
        ACCOUNTS+=(nn1234k)
        VARIANT_CONF="$ENFORCE_PART
# Sigma2's bill: the largest of the weighted TRES (per partition), not their sum.
PriorityType=priority/multifactor
PriorityFlags=MAX_TRES
# QOS limits enforced (devel: 2 h, 2 running jobs); associations are implied by limits.
AccountingStorageEnforce=limits,qos"
        QOS_SPECS=("devel MaxWall=02:00:00 MaxJobsPU=2 Flags=DenyOnLimit")
        CHECK_CPU_PART=normal CHECK_GPU_PART=a100
        PARTITION_LINES="PartitionName=normal  Nodes=@HOST@ Default=YES MaxTime=7-00:00:00 State=UP TRESBillingWeights=CPU=1.0,Mem=0.2577G
PartitionName=a100    Nodes=@HOST@ MaxTime=14-00:00:00 State=UP TRESBillingWeights=CPU=1.0,Mem=0.032G,GRES/gpu=8.0
PartitionName=accel   Nodes=@HOST@ MaxTime=7-00:00:00 State=UP TRESBillingWeights=CPU=1.0,Mem=0.0659G,GRES/gpu=6.0
PartitionName=preproc Nodes=@HOST@ MaxTime=1-00:00:00 State=UP TRESBillingWeights=CPU=1.0,Mem=0.1294G"
        ;;
    gres-only)
        SHAPE="Eagle (variant gres-only)"
        PARTITIONS=(fast proxima)
        SELECT_TYPE=select/cons_res
        NODE_GRES=gpu:h100:4 GPU_TYPE=h100 GPU_COUNT=4
        VARIANT_CPUS=64 VARIANT_MEM_MB=512000
        ACCOUNTS+=(pl0123-01)
        VARIANT_CONF=$ENFORCE_PART
        CHECK_CPU_PART=fast CHECK_GPU_PART=proxima CHECK_GPU_OPT=--gres=gpu:h100:1
        PARTITION_LINES="PartitionName=fast    Nodes=@HOST@ Default=YES MaxTime=01:00:00 State=UP
PartitionName=proxima Nodes=@HOST@ MaxTime=7-00:00:00 State=UP"
        ;;
    lumi)
        SHAPE="LUMI (variant lumi)"
        NODE_GRES=gpu:mi250:8 GPU_TYPE=mi250 GPU_COUNT=8
        VARIANT_CPUS=128 VARIANT_MEM_MB=491520
        ACCOUNTS+=(project_465000123)
        VARIANT_CONF=$ENFORCE_PART
        PARTITION_LINES="PartitionName=small      Nodes=@HOST@ Default=YES MaxTime=3-00:00:00 State=UP
PartitionName=small-g    Nodes=@HOST@ MaxTime=3-00:00:00 State=UP
PartitionName=standard-g Nodes=@HOST@ MaxTime=2-00:00:00 State=UP OverSubscribe=EXCLUSIVE
PartitionName=dev-g      Nodes=@HOST@ MaxTime=03:00:00 State=UP"
        ;;
    *)
        say "unknown variant '$VARIANT' (${VARIANTS[*]})"
        exit 2
        ;;
    esac
}

site_cluster() {
    CLUSTER=vcloud-site
    CONF_DIR=$SITE_CONF_DIR
    CTLD_SPOOL=/var/spool/slurmctld-site
    SLURMD_SPOOL=/var/spool/slurmd-site
    SFX=-site
    INSTANCE_CONF=$CONF_DIR/slurm.conf
    export SLURM_CONF=$INSTANCE_CONF # every client call of this run
}

# ---------------------------------------------------------------------------- helpers

say() { echo "$PROG: $*" >&2; }
die() {
    say "$*"
    exit 1
}
skip() {
    say "$*"
    exit 77
}
# Only the main shell reports: a failure inside $(...) already fails the command
# that uses it, which is reported then.
trap '[[ $BASHPID == "$$" ]] && die "unexpected failure (line $LINENO: $BASH_COMMAND)"' ERR

# wait_until SECONDS CMD...: poll CMD every 0.2 s until it succeeds; false on timeout.
wait_until() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@"; do
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}

# Start a daemon fully detached from us: new session, clean environment, stdin
# from /dev/null, and no file descriptor of ours (our lock on fd 9, or a pipe of
# whoever called us): a daemon holding one would keep the lock taken or the
# caller's pipe open for its whole life (a capturing caller would never see EOF).
# Early output (before the daemon opens its own log) goes to $LOG_DIR/NAME.start.log,
# not to the daemon's own log: a log file created here would belong to root, and
# daemons that drop privileges (munged, slurmdbd, slurmctld) refuse or fail to write it.
# MODE -w: wait until a self-daemonizing program has forked, so a config error that
# makes it exit at once shows in our exit status; -f: fork off a foreground program.
# LAUNCH_CONF (the site cluster's slurmctld and slurmd): the SLURM_CONF it runs with.
launch() {
    local name=$1 mode=$2 fd
    shift 2
    (
        for fd in /proc/$BASHPID/fd/*; do
            fd=${fd##*/}
            if ((fd > 2)); then eval "exec $fd>&-"; fi
        done
        exec env -i PATH="$DAEMON_PATH" LANG=C.UTF-8 HOME=/root ${LAUNCH_CONF:+SLURM_CONF="$LAUNCH_CONF"} \
            setsid "$mode" "$@" </dev/null >>"$LOG_DIR/$name.start.log" 2>&1
    )
}

# fail_start NAME LOG: one line saying NAME did not start, where to look, and the
# last line it printed before opening its own log, if any.
fail_start() {
    local name=$1 log=$2 last=""
    [[ -s $LOG_DIR/$name.start.log ]] && last=$(tail -n1 "$LOG_DIR/$name.start.log")
    die "$name did not start, see $log${last:+ (last output: $last)}"
}

# alive PID: the process exists and is not a zombie. PID 1 here (no real init) is
# slow to reap orphans, so a killed daemon can linger as a zombie: kill -0 and
# pgrep still see it, and it must not count as running.
alive() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) } # the state letter follows "(comm) "
    [[ ${stat:0:1} != [ZX] ]]
}

# The SLURM_CONF a process was started with (empty: none, the default cluster's daemons).
started_conf() {
    { tr '\0' '\n' <"/proc/$1/environ" || true; } 2>/dev/null | sed -n 's/^SLURM_CONF=//p'
}

# daemon_pid NAME PIDFILE [CONF]: the pid of a running daemon: from its pid file if that names a
# live process of that name, else the oldest live process with exactly that name; either one
# started with SLURM_CONF=CONF (none when CONF is empty), so that the site cluster's slurmd is
# never taken for the default's, nor the other way round.
daemon_pid() {
    local name=$1 pidfile=$2 conf=${3:-} pid=""
    if [[ -s $pidfile ]]; then
        pid=$(<"$pidfile")
        if [[ $pid =~ ^[0-9]+$ ]] && alive "$pid" && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$name" ]] &&
            [[ $(started_conf "$pid") == "$conf" ]]; then
            echo "$pid"
            return 0
        fi
    fi
    for pid in $(pgrep -x "$name" || true); do
        if alive "$pid" && [[ $(started_conf "$pid") == "$conf" ]]; then
            echo "$pid"
            return 0
        fi
    done
    return 1
}

# stop_daemon NAME:PIDFILE[:CONF]...: SIGTERM to each, wait for all (they take ~2 s each,
# so together), SIGKILL a daemon that ignores it for 30 s. Only those daemons' pids.
stop_daemon() {
    local spec pid pids=() left name pidfile conf
    for spec in "$@"; do
        IFS=: read -r name pidfile conf <<<"$spec"
        while pid=$(daemon_pid "$name" "$pidfile" "$conf"); do
            [[ " ${pids[*]} " == *" $pid "* ]] && break # already signalled, still exiting
            kill -TERM "$pid" 2>/dev/null || true
            kill -CONT "$pid" 2>/dev/null || true # a stopped (SIGSTOP) one handles TERM only once continued
            pids+=("$pid")
        done
    done
    if ((${#pids[@]})) && ! wait_until 30 all_gone "${pids[@]}"; then
        left=$(for pid in "${pids[@]}"; do if alive "$pid"; then echo -n "$pid "; fi; done)
        say "pids $left ignored SIGTERM for 30 s, killing them"
        kill -KILL $left 2>/dev/null || true
        wait_until 5 all_gone $left || die "could not stop pids $left"
    fi
    for spec in "$@"; do
        IFS=: read -r name pidfile conf <<<"$spec"
        rm -f "$pidfile"
    done
}
all_gone() {
    local pid
    for pid; do ! alive "$pid" || return 1; done
}

# A daemon records the hash of the config files it was started with; a running
# daemon whose stamp differs from the files on disk is restarted.
conf_hash() { cat "$@" | sha256sum | cut -d' ' -f1; }
stamp_ok() { [[ -f $RUN_DIR/$1.conf-sha && $(<"$RUN_DIR/$1.conf-sha") == "$2" ]]; }
write_stamp() { echo "$2" >"$RUN_DIR/$1.conf-sha"; }

# Replace FILE with the content on stdin only if it differs (keeps mtimes stable).
install_file() {
    local file=$1 mode=$2 owner=$3 tmp
    tmp=$(mktemp)
    cat >"$tmp"
    if [[ -f $file ]] && cmp -s "$tmp" "$file"; then
        rm -f "$tmp"
    else
        install -D -m "$mode" -o "${owner%:*}" -g "${owner#*:}" "$tmp" "$file"
        rm -f "$tmp"
    fi
    chmod "$mode" "$file"
    chown "$owner" "$file"
}

# ---------------------------------------------------------------------------- packages

# The packages are installed by tests/system-packages.sh (as root, once), never from here.
preflight() {
    [[ $(id -u) == 0 ]] || skip "needs root (it starts system daemons)"
    export PATH="$PATH:$DAEMON_PATH"
    local b missing=()
    for b in "${NEEDED_BINARIES[@]}"; do
        command -v "$b" >/dev/null 2>&1 || missing+=("$b")
    done
    if ((${#missing[@]})); then
        skip "SLURM is not installed (${missing[*]} missing): run \`bash tests/system-packages.sh\` as root"
    fi
}

# ---------------------------------------------------------------------------- config

prepare_dirs() {
    id slurm >/dev/null 2>&1 || die "user slurm does not exist (package install incomplete?)"
    install -d -m 755 -o slurm -g slurm "$LOG_DIR" "$RUN_DIR" "$CTLD_SPOOL"
    install -d -m 755 -o root -g root "$SLURMD_SPOOL" "$CONF_DIR" "$DBD_CONF_DIR"
    install -d -m 755 -o munge -g munge /run/munge
    install -d -m 700 -o munge -g munge /var/lib/munge /var/log/munge
    install -d -m 755 -o mysql -g mysql /run/mysqld
    touch "$LOG_DIR/mariadb.log"
    chown mysql:mysql "$LOG_DIR/mariadb.log"
}

# Node hardware as slurmd sees it: "CPUs=2 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=N".
node_hardware() {
    local line cpus sockets cores threads mem
    line=$(slurmd -C 2>/dev/null | head -n1) || die "slurmd -C failed"
    cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$line")
    sockets=$(sed -n 's/.*SocketsPerBoard=\([0-9]*\).*/\1/p' <<<"$line")
    cores=$(sed -n 's/.*CoresPerSocket=\([0-9]*\).*/\1/p' <<<"$line")
    threads=$(sed -n 's/.*ThreadsPerCore=\([0-9]*\).*/\1/p' <<<"$line")
    mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$line")
    [[ -n $cpus && -n $sockets && -n $cores && -n $threads && -n $mem ]] ||
        die "could not parse 'slurmd -C' output: $line"
    # Leave ~5% (at least 512 MB) for the OS and our daemons; a node whose
    # slurmd reports less memory than configured would be drained.
    local spare=$((mem / 20 > 512 ? mem / 20 : 512))
    mem=$(((mem - spare) / 256 * 256))
    if [[ -n $FAKE_CPUS || -n $FAKE_MEM_MB ]]; then
        [[ ${FAKE_CPUS:-1} =~ ^[1-9][0-9]*$ && ${FAKE_MEM_MB:-1} =~ ^[1-9][0-9]*$ ]] ||
            die "CLUSTER_UP_CPUS / CLUSTER_UP_MEM_MB must be positive integers"
        echo "CPUs=${FAKE_CPUS:-$cpus} RealMemory=${FAKE_MEM_MB:-$mem}"
    else
        echo "CPUs=$cpus Sockets=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads RealMemory=$mem"
    fi
}

# The fake GPUs of a typed variant, one device file each (slurmd wants one per GPU): character
# devices like /dev/null (1,3) where mknod is allowed, else empty files, which work as well
# (slurmd logs "is not a valid character or block device"). Nothing opens them (task/none).
fake_gpu_files() {
    local n file
    install -d -m 755 "$FAKE_GPU_DIR"
    for ((n = 0; n < GPU_COUNT; n++)); do
        file=$FAKE_GPU_DIR/gpu$n
        [[ -c $file ]] && continue
        rm -f "$file"
        mknod -m 666 "$file" c 1 3 2>/dev/null || install -m 644 /dev/null "$file"
    done
}

write_configs() {
    HOST=$(hostname -s)
    local hw overrides=""
    hw=$(node_hardware) || exit 1
    if [[ -n $FAKE_CPUS || -n $FAKE_MEM_MB ]] && [[ $VARIANT == default ]]; then
        overrides="# CLUSTER_UP_CPUS/MEM_MB: trust the node line, not the hardware slurmd detects.
SlurmdParameters=config_overrides"
    elif [[ -n $FAKE_CPUS || -n $FAKE_MEM_MB ]]; then
        overrides="# A node of the site's size on this machine: trust the node line, not the hardware
# slurmd detects. Nothing is enforced (no cgroups): jobs that run must stay small.
SlurmdParameters=config_overrides"
    fi
    # The default's file is exactly what it was before variants existed (no restart on update).
    local extra=""
    [[ -z $SFX ]] || extra=$'\n'"# A second cluster beside the default one: its own ports.
SlurmctldPort=$SITE_CTLD_PORT
SlurmdPort=$SITE_SLURMD_PORT"
    [[ -z $VARIANT_CONF ]] || extra+=$'\n'$VARIANT_CONF

    install_file "$CONF_DIR/slurm.conf" 644 root:root <<EOF
# Written by tests/slurm/cluster-up.sh (vcloud): a single-node test cluster shaped
# like $SHAPE. Rewritten on every run; edits here are overwritten and restart the daemons.
ClusterName=$CLUSTER
# Everything on this host; 127.0.0.1 so that name resolution can never get in the way.
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
MpiDefault=none
# No mail system here; the default (/bin/mail, absent) only logs an error.
MailProg=/bin/true
# No usable cgroups in this sandbox: track job processes through /proc, no CPU binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# A node that was down (slurmd stopped) becomes usable again as soon as slurmd registers.
ReturnToService=2
$overrides

SlurmctldPidFile=$RUN_DIR/slurmctld$SFX.pid
SlurmdPidFile=$RUN_DIR/slurmd$SFX.pid
SlurmctldLogFile=$LOG_DIR/slurmctld$SFX.log
SlurmdLogFile=$LOG_DIR/slurmd$SFX.log
StateSaveLocation=$CTLD_SPOOL
SlurmdSpoolDir=$SLURMD_SPOOL
SlurmctldDebug=info
SlurmdDebug=info

# Timers kept short for tests: finished jobs leave squeue after 10 s (sacct keeps
# them), SIGKILL follows SIGTERM after 5 s on cancel/timeout.
MinJobAge=10
KillWait=5
InactiveLimit=0
Waittime=0

# Scheduling: jobs start at submit time when resources are free; bf_interval=1 and
# sched_interval=2 (main loop, default 60 s) keep a pending job's start latency low.
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=2
SelectType=$SELECT_TYPE
SelectTypeParameters=CR_Core_Memory
# Without a default, a job that gives no --mem is given the whole node's memory.
DefMemPerCPU=1000
GresTypes=gpu$extra

# Accounting through slurmdbd (sacct). GRES are not tracked unless listed: needed
# for gres/gpu=N to show in sacct's AllocTRES.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
JobCompType=jobcomp/none

NodeName=$HOST NodeAddr=127.0.0.1 $hw Gres=$NODE_GRES State=UNKNOWN
${PARTITION_LINES//@HOST@/$HOST}
EOF

    # A fake GPU. It needs a device file (a file-less gpu gres is dropped by slurmd
    # and the node drains for "gres/gpu count too low"); /dev/null serves.
    if [[ -z $GPU_TYPE ]]; then
        install_file "$CONF_DIR/gres.conf" 644 root:root <<EOF
# Written by tests/slurm/cluster-up.sh: one fake GPU, no autodetection.
AutoDetect=off
NodeName=$HOST Name=gpu File=/dev/null Count=1
EOF
    else
        fake_gpu_files
        install_file "$CONF_DIR/gres.conf" 644 root:root <<EOF
# Written by tests/slurm/cluster-up.sh (variant $VARIANT): $GPU_COUNT fake GPUs of type $GPU_TYPE,
# one fake device file each, no autodetection.
AutoDetect=off
NodeName=$HOST Name=gpu Type=$GPU_TYPE File=$FAKE_GPU_DIR/gpu[0-$((GPU_COUNT - 1))]
EOF
    fi

    # slurmdbd refuses a config readable by others; it must belong to SlurmUser.
    install_file "$DBD_CONF_DIR/slurmdbd.conf" 600 slurm:slurm <<EOF
# Written by tests/slurm/cluster-up.sh.
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=slurm
DebugLevel=info
LogFile=$LOG_DIR/slurmdbd.log
PidFile=$RUN_DIR/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=$DB_USER
StoragePass=$DB_PASS
StorageLoc=$DB_NAME
EOF

    # slurmdbd logs "Database settings not recommended values" below half of its
    # recommendations (1 GB buffer pool, 900 s lock wait); mariadb allocates lazily.
    install_file "$MARIADB_CNF" 644 root:root <<EOF
# Written by tests/slurm/cluster-up.sh: values recommended for slurmdbd.
[mysqld]
bind-address=127.0.0.1
innodb_buffer_pool_size=512M
innodb_log_file_size=64M
innodb_lock_wait_timeout=900
EOF

    SLURM_HASH=$(conf_hash "$CONF_DIR/slurm.conf" "$CONF_DIR/gres.conf")
    DBD_HASH=$(conf_hash "$DBD_CONF_DIR/slurmdbd.conf")
    MARIADB_HASH=$(conf_hash "$MARIADB_CNF")
}

# ---------------------------------------------------------------------------- daemons

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    munge_ok && return 0
    if [[ ! -s /etc/munge/munge.key ]]; then
        mungekey --create --keyfile=/etc/munge/munge.key
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
    stop_daemon munged:/run/munge/munged.pid # a hung one
    say "starting munged"
    launch munged -w runuser -u munge -- munged ||
        fail_start munged /var/log/munge/munged.log
    wait_until "$TIMEOUT" munge_ok || fail_start munged /var/log/munge/munged.log
    STARTED=1
}

mariadb_ok() { mysqladmin --connect-timeout=2 ping >/dev/null 2>&1; }
mariadb_gone() {
    ! daemon_pid mariadbd /run/mysqld/mysqld.pid >/dev/null && ! daemon_pid mysqld_safe /dev/null >/dev/null
}

start_mariadb() {
    if mariadb_ok && stamp_ok mariadb "$MARIADB_HASH"; then return 0; fi
    if mariadb_ok; then
        say "restarting mariadb (config changed)"
        mysqladmin shutdown || true
        wait_until "$TIMEOUT" mariadb_gone ||
            die "mariadb did not stop"
    fi
    if [[ ! -d /var/lib/mysql/mysql ]]; then
        say "initialising the mariadb data directory"
        mariadb-install-db --user=mysql --datadir=/var/lib/mysql >>"$LOG_DIR/mariadb.log" 2>&1 ||
            die "mariadb-install-db failed, see $LOG_DIR/mariadb.log"
    fi
    say "starting mariadb"
    # mysqld_safe stays in the foreground: fork it off instead of waiting.
    launch mariadb -f mysqld_safe --skip-syslog --log-error="$LOG_DIR/mariadb.log"
    wait_until "$TIMEOUT" mariadb_ok || fail_start mariadb "$LOG_DIR/mariadb.log"
    write_stamp mariadb "$MARIADB_HASH"
    STARTED=1
}

setup_database() {
    mysql -u root <<EOF || die "could not create the slurm database/user in mariadb"
CREATE DATABASE IF NOT EXISTS $DB_NAME;
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
ALTER USER '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON $DB_NAME.* TO '$DB_USER'@'localhost';
FLUSH PRIVILEGES;
EOF
}

# Each sacctmgr call costs ~0.35 s (slurm's RPCs on loopback meet TCP delayed ACKs),
# so the liveness probe is also the query ensure_accounting needs: root's accounts.
slurmdbd_ok() {
    ROOT_ASSOCS=$(timeout 10 sacctmgr -n -P list assoc cluster="$CLUSTER" user=root format=account,qos 2>/dev/null) &&
        ROOT_ACCOUNTS=$(cut -d'|' -f1 <<<"$ROOT_ASSOCS")
}

start_slurmdbd() {
    local pid=""
    pid=$(daemon_pid slurmdbd "$RUN_DIR/slurmdbd.pid") || true
    if [[ -n $pid ]] && stamp_ok slurmdbd "$DBD_HASH" && slurmdbd_ok; then return 0; fi
    [[ -z $pid ]] || say "restarting slurmdbd (config changed or not answering)"
    stop_daemon "slurmdbd:$RUN_DIR/slurmdbd.pid"
    setup_database
    say "starting slurmdbd"
    launch slurmdbd -w slurmdbd ||
        fail_start slurmdbd "$LOG_DIR/slurmdbd.log"
    wait_until "$TIMEOUT" slurmdbd_ok || fail_start slurmdbd "$LOG_DIR/slurmdbd.log"
    write_stamp slurmdbd "$DBD_HASH"
    STARTED=1
}

# Cluster, accounts and root's associations in the accounting database; a variant's QOS.
ensure_accounting() {
    local list a missing=0
    for a in "${ACCOUNTS[@]}"; do grep -qx "$a" <<<"$ROOT_ACCOUNTS" || missing=1; done
    ((missing)) || { ensure_qos; return 0; } # the usual case: all there
    list=$(sacctmgr -n -P list cluster format=cluster) || die "sacctmgr list cluster failed, see $LOG_DIR/slurmdbd.log"
    if ! grep -qx "$CLUSTER" <<<"$list"; then
        sacctmgr -i add cluster "$CLUSTER" >/dev/null || die "sacctmgr could not add cluster $CLUSTER"
    fi
    # An account is in a cluster through its association there (accounts are shared by both
    # clusters of this database): "account|" lines, no user.
    list=$(sacctmgr -n -P list assoc cluster="$CLUSTER" format=account,user) ||
        die "sacctmgr list assoc failed, see $LOG_DIR/slurmdbd.log"
    for a in "${ACCOUNTS[@]}"; do
        if ! grep -qx "$a|" <<<"$list"; then
            sacctmgr -i add account "$a" cluster="$CLUSTER" description="vcloud test" organization=vcloud >/dev/null ||
                die "sacctmgr could not add account $a"
        fi
    done
    for a in "${ACCOUNTS[@]}"; do
        if ! grep -qx "$a" <<<"$ROOT_ACCOUNTS"; then
            sacctmgr -i add user root account="$a" cluster="$CLUSTER" >/dev/null ||
                die "sacctmgr could not associate root with account $a"
        fi
    done
    slurmdbd_ok || die "slurmdbd stopped answering, see $LOG_DIR/slurmdbd.log"
    for a in "${ACCOUNTS[@]}"; do
        grep -qx "$a" <<<"$ROOT_ACCOUNTS" || die "root is still not in account $a, see $LOG_DIR/slurmdbd.log"
    done
    ensure_qos
}

# The variant's QOS with its limits (QOS_SPECS), allowed to root in every account. They stay in
# the database when another variant is up: only an enforcing slurm.conf applies them.
ensure_qos() {
    ((${#QOS_SPECS[@]})) || return 0
    local spec name limits have wanted line
    have=$(sacctmgr -n -P list qos format=name,maxwall,maxjobspu,flags) ||
        die "sacctmgr list qos failed, see $LOG_DIR/slurmdbd.log"
    for spec in "${QOS_SPECS[@]}"; do
        read -r name limits <<<"$spec"
        # sacctmgr shows what the spec sets as name|MaxWall|MaxJobsPU|Flags.
        wanted=$(qos_line "$name" $limits)
        if ! grep -qx "$name|.*" <<<"$have"; then
            sacctmgr -i add qos "$name" $limits >/dev/null || die "sacctmgr could not add qos $name"
        elif ! grep -qxF "$wanted" <<<"$have"; then
            sacctmgr -i modify qos where name="$name" set $limits >/dev/null ||
                die "sacctmgr could not set the limits of qos $name"
        fi
        while IFS='|' read -r _ line; do
            [[ ,$line, == *,$name,* ]] && continue
            sacctmgr -i modify user where name=root cluster="$CLUSTER" set qos+="$name" >/dev/null ||
                die "sacctmgr could not allow qos $name to root"
            slurmdbd_ok || die "slurmdbd stopped answering, see $LOG_DIR/slurmdbd.log"
            break
        done <<<"$ROOT_ASSOCS"
    done
}

# qos_line NAME LIMIT=VALUE...: the line `sacctmgr list qos format=name,maxwall,maxjobspu,flags`
# prints for a QOS with these limits (MaxWall as HH:MM:SS or D-HH:MM:SS).
qos_line() {
    local name=$1 wall="" jobs="" flags="" kv
    shift
    for kv; do
        case ${kv%%=*} in
        MaxWall) wall=${kv#*=} ;;
        MaxJobsPU) jobs=${kv#*=} ;;
        Flags) flags=${kv#*=} ;;
        esac
    done
    echo "$name|$wall|$jobs|$flags"
}

slurmctld_ok() { timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP'; }

start_slurmctld() {
    local pid=""
    pid=$(daemon_pid slurmctld "$RUN_DIR/slurmctld$SFX.pid" "$INSTANCE_CONF") || true
    if [[ -n $pid ]] && stamp_ok "slurmctld$SFX" "$SLURM_HASH" && slurmctld_ok; then return 0; fi
    [[ -z $pid ]] || say "restarting slurmctld$SFX (config changed or not answering)"
    stop_daemon "slurmctld:$RUN_DIR/slurmctld$SFX.pid:$INSTANCE_CONF"
    say "starting slurmctld$SFX"
    LAUNCH_CONF=$INSTANCE_CONF launch "slurmctld$SFX" -w slurmctld ||
        fail_start "slurmctld$SFX" "$LOG_DIR/slurmctld$SFX.log"
    wait_until "$TIMEOUT" slurmctld_ok || fail_start "slurmctld$SFX" "$LOG_DIR/slurmctld$SFX.log"
    write_stamp "slurmctld$SFX" "$SLURM_HASH"
    STARTED=1
}

# slurmd has (re)registered with slurmctld since $1 (scontrol's time format).
slurmd_registered() {
    local since=$1 started
    started=$(scontrol show node "$HOST" 2>/dev/null | sed -n 's/.*SlurmdStartTime=\([^ ]*\).*/\1/p')
    [[ -n $started && ! $started < $since ]]
}

start_slurmd() {
    local pid="" since
    pid=$(daemon_pid slurmd "$RUN_DIR/slurmd$SFX.pid" "$INSTANCE_CONF") || true
    if [[ -n $pid ]] && stamp_ok "slurmd$SFX" "$SLURM_HASH"; then return 0; fi
    [[ -z $pid ]] || say "restarting slurmd$SFX (config changed)"
    stop_daemon "slurmd:$RUN_DIR/slurmd$SFX.pid:$INSTANCE_CONF"
    say "starting slurmd$SFX"
    since=$(date +%Y-%m-%dT%H:%M:%S)
    LAUNCH_CONF=$INSTANCE_CONF launch "slurmd$SFX" -w slurmd || fail_start "slurmd$SFX" "$LOG_DIR/slurmd$SFX.log"
    # Until it registers, slurmctld may still show the node idle from before;
    # stop waiting early if slurmd dies (e.g. a fatal config error).
    wait_until "$TIMEOUT" eval 'slurmd_registered "$since" || ! daemon_pid slurmd "$RUN_DIR/slurmd$SFX.pid" "$INSTANCE_CONF" >/dev/null'
    slurmd_registered "$since" || fail_start "slurmd$SFX" "$LOG_DIR/slurmd$SFX.log"
    write_stamp "slurmd$SFX" "$SLURM_HASH"
    STARTED=1
}

# Compact node state as sinfo prints it (%t): idle, mix, alloc, drain, down*, ...
node_state() { { sinfo -h -N -n "$HOST" -o %t 2>/dev/null || true; } | head -n1; }

# Wait for the node to be usable; resume it when drained or down (e.g. by an
# earlier attempt with another config, or slurmd restarts). "*" = not responding yet.
wait_node() {
    local deadline=$((SECONDS + TIMEOUT)) state resumed=0
    while ((SECONDS < deadline)); do
        state=$(node_state)
        case $state in
        idle | mix | alloc | comp) return 0 ;;
        *'*') # slurmd has not registered (yet)
            daemon_pid slurmd "$RUN_DIR/slurmd$SFX.pid" "$INSTANCE_CONF" >/dev/null ||
                fail_start "slurmd$SFX" "$LOG_DIR/slurmd$SFX.log"
            ;;
        drain* | drng* | down* | fail* | maint*)
            if ((SECONDS >= resumed)); then
                say "node $HOST is $state ($(sinfo -h -N -n "$HOST" -o %E | head -n1)), resuming it"
                scontrol update nodename="$HOST" state=resume 2>/dev/null || true
                resumed=$((SECONDS + 5))
            fi
            ;;
        esac
        sleep 0.3
    done
    die "node $HOST is '$(node_state)' ($(sinfo -h -N -n "$HOST" -o %E | head -n1)), not idle; see $LOG_DIR/slurmd$SFX.log and $LOG_DIR/slurmctld$SFX.log"
}

# ---------------------------------------------------------------------------- checks

# Cheap: daemons answer, the variant's partitions exist and are up, the node is usable.
quick_check() {
    HOST=${HOST:-$(hostname -s)}
    munge_ok || die "munged is not running (run $0 to start it)"
    slurmctld_ok || die "slurmctld$SFX is not answering, see $LOG_DIR/slurmctld$SFX.log"
    daemon_pid slurmd "$RUN_DIR/slurmd$SFX.pid" "$INSTANCE_CONF" >/dev/null ||
        die "slurmd$SFX is not running, see $LOG_DIR/slurmd$SFX.log"
    [[ -n ${ROOT_ACCOUNTS:-} ]] || slurmdbd_ok || die "slurmdbd is not answering, see $LOG_DIR/slurmdbd.log"
    local p line
    for p in "${PARTITIONS[@]}"; do
        line=$({ sinfo -h -p "$p" -o '%R %a %t' 2>/dev/null || true; } | head -n1)
        [[ -n $line ]] || die "partition $p missing from sinfo"
        read -r _ avail state <<<"$line"
        [[ $avail == up ]] || die "partition $p is $avail"
        [[ $state =~ ^(idle|mix|alloc|comp)$ ]] || die "partition $p: node is '$state', see $LOG_DIR/slurmd$SFX.log"
    done
}

# Real jobs: srun, a 2-task srun, and an sbatch GPU job seen by sacct (on the variant's
# partitions, its GPU asked for as the variant takes it).
full_check() {
    quick_check
    local tmp out id state line part limit tres
    tmp=$(mktemp -d /tmp/cluster-up-check.XXXXXX)
    CHECK_TMP=$tmp
    trap 'rm -rf "$CHECK_TMP"' EXIT

    timeout 120 srun -p "$CHECK_CPU_PART" -n1 -t 1 true >"$tmp/srun.log" 2>&1 ||
        die "'srun -p $CHECK_CPU_PART -n1 true' failed: $(tail -n1 "$tmp/srun.log")"

    out=$(timeout 120 srun -p "$CHECK_CPU_PART" -n2 -t 1 bash -c 'echo $SLURM_PROCID' 2>"$tmp/srun2.log" | sort | tr '\n' ' ') ||
        die "'srun -n2 -p $CHECK_CPU_PART' failed: $(tail -n1 "$tmp/srun2.log")"
    [[ $out == "0 1 " ]] || die "'srun -n2' printed '$out', expected ranks 0 and 1"

    id=$(sbatch --parsable -p "$CHECK_GPU_PART" "$CHECK_GPU_OPT" -t 5 -A project_465000000 -o "$tmp/job.out" \
        --wrap 'echo hi; echo "gpus=${CUDA_VISIBLE_DEVICES-unset}"' 2>"$tmp/sbatch.log") ||
        die "sbatch failed: $(tail -n1 "$tmp/sbatch.log")"
    id=${id%%;*}
    # slurmctld reports to slurmdbd asynchronously: for a job this short sacct can
    # first show COMPLETED with Partition and Timelimit still empty. Poll for both.
    sacct_done() {
        IFS='|' read -r state part _ < <(sacct -j "$id" -n -X -P -o State,Partition 2>/dev/null) || true
        [[ -n ${part:-} && ${state:-} =~ ^(COMPLETED|FAILED|CANCELLED.*|TIMEOUT|OUT_OF_MEMORY|NODE_FAIL)$ ]]
    }
    wait_until 120 sacct_done || die "job $id not finished in sacct after 120 s (state '${state:-none}', partition '${part:-}')"
    line=$(sacct -j "$id" -n -X -P -o State,Partition,Timelimit,AllocTRES)
    IFS='|' read -r state part limit tres <<<"$line"
    [[ $state == COMPLETED ]] || die "job $id ended $state, expected COMPLETED ($line)"
    [[ $part == "$CHECK_GPU_PART" ]] || die "job $id partition '$part', expected $CHECK_GPU_PART"
    [[ $limit == 00:05:00 ]] || die "job $id time limit '$limit', expected 00:05:00"
    [[ ,$tres, == *,gres/gpu=1,* ]] || die "job $id AllocTRES '$tres' lacks gres/gpu=1"
    grep -qx hi "$tmp/job.out" || die "job $id output lacks 'hi': $(head -c 200 "$tmp/job.out")"
}

# ---------------------------------------------------------------------------- modes

cmd_up() {
    local t0=$SECONDS
    prepare_dirs
    write_configs
    start_munge
    start_mariadb
    start_slurmdbd
    ensure_accounting
    start_slurmctld
    start_slurmd
    wait_node
    if ((STARTED)); then
        full_check
        say "OK: cluster $CLUSTER up on $HOST ($((SECONDS - t0)) s), variant $VARIANT, partitions ${PARTITIONS[*]}"
    else
        quick_check
        say "OK: cluster $CLUSTER already up on $HOST, variant $VARIANT"
    fi
}

cmd_check() {
    full_check
    say "OK: cluster $CLUSTER on $HOST passed the job checks, variant $VARIANT"
}

cmd_down() {
    # Reverse start order; stopping what is not running is a no-op. slurmctld
    # flushes accounting to slurmdbd on exit, which needs mariadb and munge.
    # --variant: the site cluster's two daemons only; else both clusters and what they share.
    local site=$SITE_CONF_DIR/slurm.conf
    stop_daemon "slurmd:$RUN_DIR/slurmd-site.pid:$site" "slurmctld:$RUN_DIR/slurmctld-site.pid:$site"
    if [[ -n $SFX ]]; then
        rm -f "$RUN_DIR"/*-site.conf-sha
        say "OK: the site cluster's daemons stopped"
        return 0
    fi
    stop_daemon "slurmd:$RUN_DIR/slurmd.pid" "slurmctld:$RUN_DIR/slurmctld.pid"
    stop_daemon "slurmdbd:$RUN_DIR/slurmdbd.pid"
    if mariadb_ok; then mysqladmin shutdown >/dev/null 2>&1 & fi # waits for the server to exit
    stop_daemon munged:/run/munge/munged.pid
    wait
    wait_until 30 mariadb_gone ||
        die "mariadb did not stop, see $LOG_DIR/mariadb.log"
    rm -f "$RUN_DIR"/*.conf-sha
    say "OK: all daemons stopped"
}

main() {
    local mode=up variant=default
    while (($#)); do
        case $1 in
        --up) mode=up ;;
        --check) mode=check ;;
        --down) mode=down ;;
        --variant=*) variant=${1#*=} ;;
        --variant)
            (($# > 1)) || { say "--variant needs a name (${VARIANTS[*]})"; exit 2; }
            variant=$2
            shift
            ;;
        -h | --help)
            sed -n '2,/^set -E/{/^set -E/d;s/^# \{0,1\}//;p}' "$0"
            exit 0
            ;;
        *)
            say "unknown argument '$1' (use --check, --down, --variant NAME or nothing)"
            exit 2
            ;;
        esac
        shift
    done
    set_variant "$variant"
    if [[ $VARIANT != default ]]; then # the site's node, whatever CLUSTER_UP_* say
        FAKE_CPUS=$VARIANT_CPUS
        FAKE_MEM_MB=$VARIANT_MEM_MB
    fi
    preflight
    # One run at a time (parallel pytest workers may all call us).
    mkdir -p "$(dirname "$LOCK_FILE")"
    exec 9>"$LOCK_FILE"
    flock -w 900 9 || die "another cluster-up.sh kept $LOCK_FILE locked for 15 min"
    "cmd_$mode"
}

main "$@"
