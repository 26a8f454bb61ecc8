#!/usr/bin/env bash
# A single-node SLURM cluster on localhost, for tests/end_to_end/test_slurm_real.py (and for trying slurm/array.sbatch).
#
#   slurm/ci/cluster.sh install   # apt-get install slurm-wlm munge (Debian/Ubuntu, needs root)
#   slurm/ci/cluster.sh start     # write a config under $KVBENCH_SLURM_DIR, start munged, slurmctld, slurmd
#   slurm/ci/cluster.sh status    # sinfo
#   slurm/ci/cluster.sh stop      # stop the daemons this script started
#
# Everything lives under $KVBENCH_SLURM_DIR (default /tmp/kvbench-slurm): config, state, logs, pid files.  Clients
# find the cluster through SLURM_CONF=$KVBENCH_SLURM_DIR/slurm.conf (the start command prints it).  Jobs run as the
# invoking user (root on CI containers); process tracking is proctrack/linuxproc, so no cgroups are needed.
set -euo pipefail

DIR=${KVBENCH_SLURM_DIR:-/tmp/kvbench-slurm}
CONF=$DIR/slurm.conf
NODE=$(hostname -s)
USER_NAME=$(id -un)

log() { echo "[cluster] $*" >&2; }

install() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
        log "slurm-wlm and munge already installed ($(slurmd -V))"
        return
    fi
    [ "$(id -u)" = 0 ] || { log "install needs root (apt-get)"; exit 1; }
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends slurm-wlm munge
}

write_config() {
    mkdir -p "$DIR"/{state,spool,log,run,munge}
    local cpus mem
    cpus=$(getconf _NPROCESSORS_ONLN)  # not nproc: it honours OMP_NUM_THREADS
    mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
    cat > "$CONF" <<CONF
# Written by slurm/ci/cluster.sh: a one-node test cluster.
ClusterName=kvbench-ci
SlurmctldHost=$NODE
SlurmUser=$USER_NAME
SlurmdUser=root
SlurmctldPort=${KVBENCH_SLURMCTLD_PORT:-16817}
SlurmdPort=${KVBENCH_SLURMD_PORT:-16818}
AuthType=auth/munge
CryptoType=crypto/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# Fast scheduling for tests.
SchedulerParameters=sched_interval=2,bf_interval=2
MinJobAge=300
KillWait=30
MaxArraySize=1001
NodeName=$NODE CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
CONF
}

start_munge() {
    local key=/etc/munge/munge.key
    if [ ! -s "$key" ]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom bs=1 count=1024 of="$key" 2>/dev/null
        chmod 400 "$key"
    fi
    if [ -f "$DIR/run/munged.pid" ] && kill -0 "$(cat "$DIR/run/munged.pid")" 2>/dev/null; then
        return
    fi
    munged --socket="$DIR/munge/munge.socket" --pid-file="$DIR/run/munged.pid" \
        --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" --key-file="$key" --force
}

start() {
    write_config
    start_munge
    export SLURM_CONF=$CONF
    if ! { [ -f "$DIR/run/slurmctld.pid" ] && kill -0 "$(cat "$DIR/run/slurmctld.pid")" 2>/dev/null; }; then
        slurmctld -f "$CONF" -c -i
    fi
    if ! { [ -f "$DIR/run/slurmd.pid" ] && kill -0 "$(cat "$DIR/run/slurmd.pid")" 2>/dev/null; }; then
        slurmd -f "$CONF" -c
    fi
    for _ in $(seq 1 60); do
        if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
            log "up: $(sinfo -h -o '%P %D %T %c')"
            echo "export SLURM_CONF=$CONF"
            return
        fi
        sleep 1
    done
    log "the node did not become idle; logs:"
    tail -n 20 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" >&2 || true
    exit 1
}

stop() {
    for daemon in slurmd slurmctld munged; do
        local pid_file=$DIR/run/$daemon.pid pid
        pid=$(cat "$pid_file" 2>/dev/null || true)
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            kill "$pid"
            for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
            log "stopped $daemon"
        fi
        rm -f "$pid_file"
    done
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    status) SLURM_CONF=$CONF sinfo ;;
    *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
