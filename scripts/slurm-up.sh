#!/usr/bin/env bash
# Start a real one-node Slurm cluster (slurmctld + slurmd + munged) for integration tests.
#
# The node is $(hostname -s) with CPUs=$(nproc) and 8 placeholder GPUs (gres/gpu backed by
# plain files), in one default partition "gpu". Idempotent: a second run leaves one healthy
# cluster (daemons are restarted only when the written configuration changed).
# Works in containers without systemd: daemons are started directly.
#
# Environment:
#   PEERWATCH_SLURM_STATE      state dir: spool, controller state, logs, pid files, GPU
#                              placeholders (default /var/lib/peerwatch-slurm)
#   PEERWATCH_SLURM_PROLOG     executable to run as Prolog= (unset: no prolog)
#   PEERWATCH_SLURM_EPILOG     executable to run as Epilog= (unset: no epilog)
#   PEERWATCH_SLURM_EPILOG_SLURMCTLD  executable to run as EpilogSlurmctld= (unset: none)
#   PEERWATCH_SLURM_TIMEOUT_S  how long to wait for each daemon / the node (default 60)
#   PEERWATCH_SLURM_ACCOUNTING slurmdbd (default) or none.
#       slurmdbd: also installs slurmdbd + mariadb-server and runs a private MariaDB (data
#       under $STATE/mysql, unix socket only, no TCP port), so `sacct --json` works.
#       none: no database; plain sacct says "Slurm accounting storage is disabled" and
#       `sacct --json` exits 1. Finished jobs are always also written by jobcomp/filetxt
#       to $STATE/log/jobcomp.txt (`sacct --completion`, text output only).
set -euo pipefail

STATE="${PEERWATCH_SLURM_STATE:-/var/lib/peerwatch-slurm}"
TIMEOUT_S="${PEERWATCH_SLURM_TIMEOUT_S:-60}"
CONF_DIR=/etc/slurm
NODE="$(hostname -s)"
GPUS=8
ACCOUNTING="${PEERWATCH_SLURM_ACCOUNTING:-slurmdbd}"
DB_SOCKET=/run/mysqld/mysqld.sock

log() { printf 'slurm-up: %s\n' "$*" >&2; }

die() {
    log "ERROR: $*"
    local f
    for f in "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" "$STATE/log/slurmdbd.log" \
        "$STATE/mysql/mariadb.err" /var/log/munge/munged.log; do
        if [[ -f "$f" ]]; then
            printf '\n===== tail %s =====\n' "$f" >&2
            tail -n 30 "$f" >&2 || true
        fi
    done
    exit 1
}

# Wait until "$@" succeeds, polling every 0.2 s, for at most $1 seconds.
poll() {
    local timeout_s="$1"
    shift
    local deadline=$((SECONDS + timeout_s))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            return 1
        fi
        sleep 0.2
    done
}

pid_alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

[[ "$(id -u)" == 0 ]] || die "must run as root (daemons, /etc/slurm, the munge key)"
case "$ACCOUNTING" in
slurmdbd | none) ;;
*) die "PEERWATCH_SLURM_ACCOUNTING must be slurmdbd or none, not '$ACCOUNTING'" ;;
esac

# ---- 1. packages ---------------------------------------------------------------------------
install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sinfo >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    if [[ "$ACCOUNTING" == slurmdbd ]]; then
        command -v slurmdbd >/dev/null || missing+=(slurmdbd)
        command -v mariadbd >/dev/null || missing+=(mariadb-server)
    fi
    ((${#missing[@]} == 0)) && return 0
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Only refresh the package lists when apt does not know the packages yet.
    if ! apt-get install -y --no-install-recommends "${missing[@]}" >&2; then
        apt-get update >&2
        apt-get install -y --no-install-recommends "${missing[@]}" >&2
    fi
}
install_packages

# ---- 2. munge ------------------------------------------------------------------------------
start_munge() {
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/log/munge /etc/munge
    install -d -o munge -g munge -m 0711 /var/lib/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "creating /etc/munge/munge.key"
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile=/etc/munge/munge.key --force
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
        fi
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
    if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        if pid_alive /run/munge/munged.pid; then
            die "munged runs but credentials do not round-trip"
        fi
        log "starting munged"
        rm -f /run/munge/munged.pid
        # munged refuses to run as root; --force tolerates the loose permissions of containers.
        runuser -u munge -- /usr/sbin/munged --force
        poll 15 bash -c 'munge -n | unmunge' || die "munged did not come up"
    fi
}
start_munge

# ---- 3. configuration ----------------------------------------------------------------------
install -d -m 0755 "$STATE" "$STATE/ctld" "$STATE/spool" "$STATE/log" "$STATE/run" "$STATE/dev"
install -d -m 0755 "$CONF_DIR"
for ((i = 0; i < GPUS; i++)); do
    [[ -e "$STATE/dev/nvidia$i" ]] || : >"$STATE/dev/nvidia$i"
done

CPUS="$(nproc)"
MEM_TOTAL_MB=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024))
# Slurm drains a node that registers with less memory than RealMemory: leave head room.
REAL_MEMORY_MB=$((MEM_TOTAL_MB * 9 / 10))

for var in PEERWATCH_SLURM_PROLOG PEERWATCH_SLURM_EPILOG PEERWATCH_SLURM_EPILOG_SLURMCTLD; do
    path="${!var:-}"
    if [[ -n "$path" && ! -x "$path" ]]; then
        die "$var=$path is not an executable file"
    fi
done

render_slurm_conf() {
    cat <<EOF
# Written by peerwatch scripts/slurm-up.sh: a one-node test cluster. Do not edit by hand.
ClusterName=peerwatch-test
SlurmctldHost=${NODE}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SchedulerType=sched/backfill
ReturnToService=2
# Finished jobs stay visible to squeue/scontrol for 5 minutes.
MinJobAge=300
EOF
    if [[ "$ACCOUNTING" == slurmdbd ]]; then
        echo "AccountingStorageType=accounting_storage/slurmdbd"
        echo "AccountingStorageHost=127.0.0.1"
        # GPU counts appear in sacct's TRES only when listed here.
        echo "AccountingStorageTRES=gres/gpu"
    else
        echo "AccountingStorageType=accounting_storage/none"
    fi
    cat <<EOF
JobCompType=jobcomp/filetxt
JobCompLoc=${STATE}/log/jobcomp.txt
StateSaveLocation=${STATE}/ctld
SlurmdSpoolDir=${STATE}/spool
SlurmctldPidFile=${STATE}/run/slurmctld.pid
SlurmdPidFile=${STATE}/run/slurmd.pid
SlurmctldLogFile=${STATE}/log/slurmctld.log
SlurmdLogFile=${STATE}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
EOF
    if [[ -n "${PEERWATCH_SLURM_PROLOG:-}" ]]; then
        echo "Prolog=${PEERWATCH_SLURM_PROLOG}"
    fi
    if [[ -n "${PEERWATCH_SLURM_EPILOG:-}" ]]; then
        echo "Epilog=${PEERWATCH_SLURM_EPILOG}"
    fi
    if [[ -n "${PEERWATCH_SLURM_EPILOG_SLURMCTLD:-}" ]]; then
        echo "EpilogSlurmctld=${PEERWATCH_SLURM_EPILOG_SLURMCTLD}"
    fi
    cat <<EOF
NodeName=${NODE} NodeAddr=127.0.0.1 CPUs=${CPUS} RealMemory=${REAL_MEMORY_MB} Gres=gpu:${GPUS} State=UNKNOWN
# OverSubscribe lets several GPU jobs share the few CPUs of a CI machine; GPUs stay exclusive.
PartitionName=gpu Nodes=${NODE} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:${GPUS}
EOF
}

render_gres_conf() {
    cat <<EOF
# Written by peerwatch scripts/slurm-up.sh: placeholder files stand in for /dev/nvidia*.
AutoDetect=off
Name=gpu File=${STATE}/dev/nvidia[0-$((GPUS - 1))]
EOF
}

# Nothing here needs cgroups (linuxproc + task/none); the file keeps slurmd from probing them.
render_cgroup_conf() {
    cat <<EOF
# Written by peerwatch scripts/slurm-up.sh.
CgroupPlugin=autodetect
IgnoreSystemd=yes
EOF
}

db_password() {
    # Created once; the database only listens on a root-owned unix socket anyway.
    local f="$STATE/run/db-password"
    if [[ ! -s "$f" ]]; then
        (umask 077 && head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$f")
    fi
    cat "$f"
}

render_slurmdbd_conf() {
    cat <<EOF
# Written by peerwatch scripts/slurm-up.sh.
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
LogFile=${STATE}/log/slurmdbd.log
PidFile=${STATE}/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$(db_password)
StorageLoc=slurm_acct_db
EOF
}

CHANGED=0
write_if_changed() {
    local target="$1" tmp
    tmp="$(mktemp)"
    "$2" >"$tmp"
    if [[ -f "$target" ]] && cmp -s "$tmp" "$target"; then
        rm -f "$tmp"
        return 0
    fi
    install -m "${3:-0644}" "$tmp" "$target"
    rm -f "$tmp"
    CHANGED=1
    log "wrote $target"
}
write_if_changed "$CONF_DIR/slurm.conf" render_slurm_conf
write_if_changed "$CONF_DIR/gres.conf" render_gres_conf
write_if_changed "$CONF_DIR/cgroup.conf" render_cgroup_conf
if [[ "$ACCOUNTING" == slurmdbd ]]; then
    # slurmdbd refuses a config readable by others: it holds the database password.
    write_if_changed "$CONF_DIR/slurmdbd.conf" render_slurmdbd_conf 0600
fi

# ---- 4. daemons ----------------------------------------------------------------------------
CTLD_PID="$STATE/run/slurmctld.pid"
SLURMD_PID="$STATE/run/slurmd.pid"

DBD_PID="$STATE/run/slurmdbd.pid"

if ((CHANGED)) && { pid_alive "$CTLD_PID" || pid_alive "$SLURMD_PID" || pid_alive "$DBD_PID"; }; then
    log "configuration changed: restarting the Slurm daemons"
    SLURM_DOWN_KEEP_MUNGE=1 SLURM_DOWN_KEEP_DB=1 PEERWATCH_SLURM_STATE="$STATE" \
        "$(dirname "$(readlink -f "$0")")/slurm-down.sh"
fi

start_mariadb() {
    local datadir="$STATE/mysql"
    install -d -o mysql -g mysql -m 0755 /run/mysqld
    if [[ ! -d "$datadir/mysql" ]]; then
        log "initialising MariaDB in $datadir"
        install -d -o mysql -g mysql -m 0750 "$datadir"
        mariadb-install-db --user=mysql --datadir="$datadir" --skip-test-db \
            --auth-root-authentication-method=socket >"$STATE/log/mariadb-install.log" 2>&1 ||
            die "mariadb-install-db failed: see $STATE/log/mariadb-install.log"
    fi
    if ! mariadb-admin --socket="$DB_SOCKET" ping >/dev/null 2>&1; then
        log "starting mariadbd"
        # --no-defaults: the system my.cnf must not move our socket or data dir.
        # --skip-networking: slurmdbd reaches it through the unix socket ("localhost").
        setsid mariadbd --no-defaults --user=mysql --datadir="$datadir" \
            --socket="$DB_SOCKET" --pid-file=/run/mysqld/mariadbd.pid --skip-networking \
            --log-error="$datadir/mariadb.err" --innodb-buffer-pool-size=128M \
            --innodb-lock-wait-timeout=900 </dev/null >/dev/null 2>&1 &
        disown
        poll "$TIMEOUT_S" mariadb-admin --socket="$DB_SOCKET" ping || die "mariadbd did not come up"
    fi
    local pw
    pw="$(db_password)"
    mariadb --socket="$DB_SOCKET" -u root <<SQL || die "could not create the slurm database user"
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '${pw}';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '${pw}';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
SQL
}

if [[ "$ACCOUNTING" == slurmdbd ]]; then
    start_mariadb
    if ! pid_alive "$DBD_PID"; then
        log "starting slurmdbd"
        rm -f "$DBD_PID"
        slurmdbd || die "slurmdbd failed to start"
    fi
    poll "$TIMEOUT_S" sacctmgr -n show cluster || die "slurmdbd does not answer sacctmgr"
    if [[ -z "$(sacctmgr -n -P show cluster peerwatch-test format=cluster 2>/dev/null)" ]]; then
        sacctmgr -i add cluster peerwatch-test >&2 || die "could not register the cluster"
    fi
fi

if ! pid_alive "$CTLD_PID"; then
    log "starting slurmctld"
    rm -f "$CTLD_PID"
    # -i: a stale or partial state file from a killed run must not stop the controller.
    slurmctld -i || die "slurmctld failed to start"
fi
poll "$TIMEOUT_S" scontrol ping || die "slurmctld does not answer scontrol ping"

if ! pid_alive "$SLURMD_PID"; then
    log "starting slurmd"
    rm -f "$SLURMD_PID"
    slurmd || die "slurmd failed to start"
fi

node_state() { sinfo -h -N -n "$NODE" -o '%T' 2>/dev/null | head -n 1; }
node_usable() {
    case "$(node_state)" in
    idle | mixed | allocated | completing) return 0 ;;
    *) return 1 ;;
    esac
}

deadline=$((SECONDS + TIMEOUT_S))
resumed=0
until node_usable; do
    state="$(node_state)"
    # A drain or down left over from an earlier run (not a node still registering, marked '*').
    if ((!resumed)) && [[ "$state" =~ ^(drained|draining|down|drain)$ ]]; then
        log "node $NODE is $state: resuming it"
        scontrol update nodename="$NODE" state=resume || true
        resumed=1
    fi
    if ((SECONDS >= deadline)); then
        die "node $NODE not usable after ${TIMEOUT_S}s (state: '${state:-unknown}'; sinfo -R: $(sinfo -h -R 2>&1 | tr '\n' ' '))"
    fi
    sleep 0.2
done
log "cluster peerwatch-test up: node $NODE is $(node_state) with gpu:$GPUS"
