#!/bin/sh
# A single-node Slurm (munge, slurmctld, slurmd) on this host, for tests that
# launch with `srun --mpi=pmix`.  Run as root.
#
#   contrib/slurm-single-node.sh start    start it (again: stop first), wait until
#                                         the node takes jobs
#   contrib/slurm-single-node.sh stop     stop what `start` started, by PID
#   contrib/slurm-single-node.sh status   exit 0 when it takes jobs
#
# State (configuration, spool, logs, PID files) lives in $FERRY_SLURM_DIR
# (default /var/tmp/ferry-slurm).  /etc/slurm/slurm.conf is written only when
# it is absent or one this script wrote (it carries the marker line below); a
# host with its own Slurm configuration is left alone.  munged is started only
# when none runs, and then stopped by `stop`.
set -e
dir=${FERRY_SLURM_DIR:-/var/tmp/ferry-slurm}
conf=/etc/slurm/slurm.conf
marker="# written by ferry contrib/slurm-single-node.sh"

log() { echo "slurm-single-node: $*" >&2; }

need_root() {
    [ "$(id -u)" -eq 0 ] || { log "run as root"; exit 1; }
}

# Stop the daemon whose PID is in $1 (only if it is the program $2), wait.
stop_pid() {
    pidfile=$1 program=$2
    [ -f "$pidfile" ] || return 0
    pid=$(cat "$pidfile" 2>/dev/null || true)
    rm -f "$pidfile"
    [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 0
    case "$(cat /proc/"$pid"/comm 2>/dev/null)" in
    "$program"*) ;;
    *) return 0 ;; # the PID was reused by something else
    esac
    kill -TERM "$pid" 2>/dev/null || true
    i=0
    while [ -d "/proc/$pid" ] && [ $i -lt 100 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    if [ -d "/proc/$pid" ]; then
        kill -KILL "$pid" 2>/dev/null || true
    fi
}

do_stop() {
    # Jobs first, so slurmd does not wait for their steps.
    if [ -f "$dir/slurmctld.pid" ] && command -v scancel >/dev/null 2>&1; then
        timeout 5 scancel --full --quiet --partition=ferry 2>/dev/null || true
    fi
    stop_pid "$dir/slurmd.pid" slurmd
    stop_pid "$dir/slurmctld.pid" slurmctld
    if [ -f "$dir/munged.ours" ]; then
        stop_pid /run/munge/munged.pid munged
        rm -f "$dir/munged.ours"
    fi
}

munge_up() {
    command -v munge >/dev/null 2>&1 && munge -n 2>/dev/null | unmunge >/dev/null 2>&1
}

do_status() {
    command -v sinfo >/dev/null 2>&1 || return 1
    state=$(timeout 5 sinfo -h -p ferry -o %T 2>/dev/null | head -n 1)
    case "$state" in
    idle* | mix* | alloc*) return 0 ;;
    *) return 1 ;;
    esac
}

do_start() {
    need_root
    for program in munged slurmctld slurmd srun sinfo; do
        command -v $program >/dev/null 2>&1 || PATH=$PATH:/usr/sbin
        command -v $program >/dev/null 2>&1 || {
            log "$program is not installed (contrib/install-deps.sh test installs it)"
            exit 1
        }
    done
    if [ -f "$conf" ] && ! grep -qF "$marker" "$conf"; then
        log "$conf exists and is not ours: not touching this host's Slurm"
        exit 1
    fi
    do_stop
    mkdir -p "$dir/spool/ctld" "$dir/spool/d"

    if ! munge_up; then
        [ -f /etc/munge/munge.key ] || mungekey -c
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
        mkdir -p /run/munge /var/log/munge /var/lib/munge
        chown munge:munge /run/munge /var/log/munge /var/lib/munge
        runuser -u munge -- munged
        touch "$dir/munged.ours"
        i=0
        until munge_up; do
            i=$((i + 1))
            [ $i -lt 50 ] || { log "munged does not answer"; do_stop; exit 1; }
            sleep 0.1
        done
    fi

    host=$(hostname -s 2>/dev/null || hostname)
    cpus=$(nproc)
    mkdir -p /etc/slurm
    cat >"$conf" <<EOF
$marker
ClusterName=ferry
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=pmix
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
StateSaveLocation=$dir/spool/ctld
SlurmdSpoolDir=$dir/spool/d
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=10
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=ferry Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
EOF
    : >"$dir/slurmctld.log"
    : >"$dir/slurmd.log"
    slurmctld -c || { log "slurmctld did not start: $(tail -n 5 "$dir/slurmctld.log")"; do_stop; exit 1; }
    slurmd || { log "slurmd did not start: $(tail -n 5 "$dir/slurmd.log")"; do_stop; exit 1; }
    i=0
    until do_status; do
        i=$((i + 1))
        if [ $i -ge 150 ]; then
            log "the node never came up; slurmctld.log and slurmd.log say:"
            tail -n 10 "$dir/slurmctld.log" "$dir/slurmd.log" >&2
            do_stop
            exit 1
        fi
        sleep 0.2
    done
    log "up: partition ferry, node $host, $cpus CPUs (logs in $dir)"
}

case "${1:-}" in
start) do_start ;;
stop) need_root; do_stop ;;
status) do_status ;;
*)
    echo "usage: $0 start|stop|status" >&2
    exit 2
    ;;
esac
