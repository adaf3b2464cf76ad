#!/usr/bin/env bash
# A real single-node Slurm on this machine, for trying sweeps' --executor slurm and for the tests
# (tests/test_slurm.py): munge, slurmctld and slurmd as root, listening on 127.0.0.1 only, their state
# under $SLURM_CLUSTER_DIR (default /tmp/fairseq-idpg-slurm).
#
#   eval "$(bash scripts/slurm_cluster.sh start)"   # install if missing, start (idempotent); prints the exports
#   sbatch --wrap hostname; squeue                   # then any Slurm command, scripts/sweep.sh --executor slurm
#   bash scripts/slurm_cluster.sh status             # "running" (exit 0) or "stopped" (exit 1)
#   bash scripts/slurm_cluster.sh stop               # stop the three daemons (a fresh start forgets their jobs)
#
# The cluster: one node (this machine's CPUs, no GPUs), one partition `debug` (the default, no time
# limit), no accounting database (sacct does not work; finished jobs stay visible to squeue for a day).
# When it cannot start (not root, no apt-get, the packages not installable) it says why in one line
# on stderr, exit 3; other errors exit 1.
set -euo pipefail

DIR=${SLURM_CLUSTER_DIR:-/tmp/fairseq-idpg-slurm}
CTLD_PORT=${SLURM_CLUSTER_PORT:-6817}
CONF=$DIR/slurm.conf
PACKAGES=(munge slurmctld slurmd slurm-client)

cannot() { echo "slurm_cluster.sh: cannot start: $*" >&2; exit 3; }

exports() { echo "export SLURM_CONF=$CONF"; }

alive() { kill -0 "$(cat "$DIR/$1.pid" 2>/dev/null)" 2>/dev/null; }

install_packages() {
    local missing=()
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    command -v apt-get >/dev/null || cannot "no apt-get to install ${missing[*]}"
    # Debian's packages would start the daemons with their system-wide config: policy-rc.d says no
    # (invoke-rc.d asks it), so only the daemons started below run.
    DEBIAN_FRONTEND=noninteractive apt-get -y -q install --no-install-recommends "${missing[@]}" \
        >"$DIR/apt.log" 2>&1 || cannot "apt-get install ${missing[*]} failed (see $DIR/apt.log)"
}

write_conf() {
    local cpus mem
    cpus=$(nproc --all)  # --all: OMP_NUM_THREADS (a test worker sets it) changes what plain nproc says
    mem=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2)) # half the memory, in MB
    cat >"$CONF" <<EOF
# written by scripts/slurm_cluster.sh
ClusterName=idpg
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$((CTLD_PORT + 1))
# bind to the addresses above (loopback), not to every interface
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/d
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
# containers have no usable cgroups: track processes by their parent, no task binding
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
# a requeued job made eligible starts within a second, not at the next minute's pass
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobRequeue=1
ReturnToService=2
# no accounting database: finished jobs stay in squeue's view for a day instead of 5 minutes
MinJobAge=86400
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# SIGTERM to SIGKILL of a cancelled, requeued or timed-out job: 2 s (30 on most clusters). A sweep's job outlives
# SIGTERM (submitit's process ignores it), so each requeue and scancel of a running job waits this long; what the
# run keeps (its checkpoints) is on disk already
KillWait=2
# a command that cannot reach the controller (the tests stop it) retries once a second for this long before it
# gives up: 5 s, not the default 10 (a sweep stops following after 3 such polls), still seconds more than an
# answer takes on a loaded machine
MessageTimeout=5
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
    [[ $(id -u) == 0 ]] || cannot "not root (the daemons and apt-get need root)"
    mkdir -p "$DIR/ctld" "$DIR/d"
    exec 9>"$DIR/lock" # the daemons are started without it (9>&-): it is released when this script ends
    flock 9 # two starts at once (two test processes): one starts, the other finds it running
    install_packages
    if alive slurmctld && alive slurmd && alive munged && SLURM_CONF=$CONF scontrol ping >/dev/null 2>&1; then
        exports
        return 0
    fi
    # start only what is not running: a controller restarted under running jobs finds them again
    write_conf
    if ! alive slurmctld && ! alive slurmd; then
        # a fresh start forgets the jobs of the last one: a job whose end the stopped daemons never exchanged is
        # recovered as running and would hold the node's CPUs until its time limit
        rm -rf "$DIR/ctld" "$DIR/d"
        mkdir -p "$DIR/ctld" "$DIR/d"
    fi
    if [[ ! -s $DIR/munge.key ]]; then
        dd if=/dev/urandom of="$DIR/munge.key" bs=1024 count=1 status=none
        chmod 600 "$DIR/munge.key"
    fi
    # --force: munged refuses to run as root otherwise
    alive munged || munged --force --socket="$DIR/munge.socket" --key-file="$DIR/munge.key" \
        --pid-file="$DIR/munged.pid" --log-file="$DIR/munged.log" --seed-file="$DIR/munge.seed" 9>&- ||
        cannot "munged did not start ($DIR/munged.log)"
    export SLURM_CONF=$CONF
    alive slurmctld || slurmctld -i 9>&- || cannot "slurmctld did not start ($DIR/slurmctld.log)"
    alive slurmd || slurmd -N localhost 9>&- || cannot "slurmd did not start ($DIR/slurmd.log)"
    for _ in $(seq 100); do # the node registers within a second or two
        if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
            exports
            return 0
        fi
        sleep 0.2
    done
    cannot "the node did not come up (sinfo: $(sinfo -h -o '%T %E' 2>&1 | head -1); $DIR/slurmd.log)"
}

stop_daemons() {
    local name
    for name in slurmd slurmctld munged; do
        if alive "$name"; then
            kill "$(cat "$DIR/$name.pid")"
            for _ in $(seq 50); do alive "$name" || break; sleep 0.1; done
        fi
        rm -f "$DIR/$name.pid"
    done
}

case ${1:-} in
start) start ;;
stop) stop_daemons ;;
status) if alive slurmctld && alive slurmd; then echo running; else echo stopped; exit 1; fi ;;
env) exports ;;
*) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
