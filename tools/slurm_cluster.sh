#!/usr/bin/env bash
# A single-node SLURM cluster and a PostgreSQL server on this machine, an `autofit search` sweep
# run through them (hydra/launcher=submitit_slurm, storage=postgresql://...), and everything it
# started stopped again at the end, by pid file.
#
#   sudo tools/slurm_cluster.sh            # as root: it installs and starts daemons
#
# What it does (Debian 12; how it was first brought up: slurm-wlm 22.05 and munge 0.5.15 from
# Debian, slurmctld and slurmd as root on localhost, PostgreSQL 15 beside them):
#   1. apt-get install slurm-wlm munge, if slurmctld or munged is missing;
#   2. munged, unless one already answers (`munge -n | unmunge`);
#   3. a slurm.conf of its own (this machine's hostname, CPUs and memory) in a scratch folder,
#      named by SLURM_CONF for the daemons and for sbatch/squeue (submitit calls them);
#   4. a PostgreSQL cluster of its own (initdb, pg_ctl) on a free port, and a database `autofit`;
#   5. docs/cluster.md's example sweep: 4 searches, all of which must succeed (exit 0), then a sweep
#      with one job that fails at run time, whose one summary line must name it (exit 1);
#   6. the trials each study holds in PostgreSQL, then stops slurmd, slurmctld, PostgreSQL and
#      munged (only the daemons it started), and removes the scratch folder unless KEEP=1.
#
# Environment: PYTHON (default .venv/bin/python; needs autofit[cluster] and psycopg), WORK (the
# scratch folder; default a new one under /tmp), KEEP=1 keeps it.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
WORK=${WORK:-$(mktemp -d /tmp/autofit-slurm.XXXXXX)}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
RUN=$WORK/run        # pid files
mkdir -p "$RUN" "$WORK/slurm/spool" "$WORK/slurm/state" "$WORK/slurm/log" "$WORK/sweep"
chmod 755 "$WORK"    # the postgres user reaches its data folder through it

say() { printf '\n== %s\n' "$*"; }

stop_pid_file() {    # stop the process a pid file names, if it still runs, then wait for it
    local file=$1 pid
    [[ -s $file ]] || return 0
    pid=$(head -n1 "$file")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        echo "stopped $(basename "$file" .pid) (pid $pid)"
    fi
}

cleanup() {
    local status=$?
    say "stopping what this script started"
    if [[ -s $RUN/slurmctld.pid ]]; then
        scancel --user=root 2>/dev/null || true   # jobs of a sweep cut short
    fi
    stop_pid_file "$RUN/slurmd.pid"
    stop_pid_file "$RUN/slurmctld.pid"
    if [[ -s $WORK/pg/data/postmaster.pid ]]; then
        su postgres -s /bin/sh -c "$PG_BIN/pg_ctl -D '$WORK/pg/data' -m fast -w stop" >/dev/null
        echo "stopped postgres"
    fi
    stop_pid_file "$RUN/munged.pid"
    if [[ ${KEEP:-0} != 1 ]]; then rm -rf "$WORK"; else echo "kept $WORK"; fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

say "packages"
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge
fi
echo "slurm $(slurmctld -V | awk '{print $2}'), munge $(munged -V | awk '{print $1}' | cut -d- -f2)"
"$PYTHON" -c "import hydra_plugins.hydra_submitit_launcher, psycopg" 2>/dev/null || {
    echo "$PYTHON lacks the submitit launcher or psycopg: pip install -e '.[cluster]'" >&2
    exit 1
}

say "munge"
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    echo "a munged already runs; using it"
else
    mkdir -p /run/munge && chown munge:munge /run/munge
    su munge -s /bin/sh -c "/usr/sbin/munged --pid-file=/run/munge/munged.pid"
    cp /run/munge/munged.pid "$RUN/munged.pid"
    munge -n | unmunge | grep STATUS
fi

say "slurm"
export SLURM_CONF=$WORK/slurm/slurm.conf
CPUS=$(nproc)
MEMORY_MIB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 8 / 10 ))  # leave 20% to us
cat >"$SLURM_CONF" <<EOF
ClusterName=autofit
SlurmctldHost=localhost
SlurmUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmdSpoolDir=$WORK/slurm/spool
StateSaveLocation=$WORK/slurm/state
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
SlurmctldLogFile=$WORK/slurm/log/slurmctld.log
SlurmdLogFile=$WORK/slurm/log/slurmd.log
NodeName=localhost NodeHostname=$(hostname) NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEMORY_MIB State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
/usr/sbin/slurmctld -i
/usr/sbin/slurmd -N localhost 2>/dev/null
for _ in $(seq 60); do
    sinfo -h -o %t 2>/dev/null | grep -qx idle && break
    sleep 1
done
sinfo
srun -N1 -n1 hostname

say "postgresql"
PORT=$("$PYTHON" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
mkdir -p "$WORK/pg/data" && chown -R postgres:postgres "$WORK/pg"
su postgres -s /bin/sh -c "$PG_BIN/initdb -D '$WORK/pg/data' -U postgres -A trust" >/dev/null
su postgres -s /bin/sh -c "$PG_BIN/pg_ctl -D '$WORK/pg/data' -l '$WORK/pg/log' -w \
    -o '-p $PORT -k $WORK/pg -c listen_addresses=127.0.0.1' start" >/dev/null
"$PG_BIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres autofit
STORAGE=postgresql://postgres@127.0.0.1:$PORT/autofit
"$PG_BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -Atc "select version()" autofit | cut -d, -f1
echo "storage=$STORAGE"

cd "$WORK/sweep"
# What a SLURM sweep needs beyond the sweep itself: the partition, a time limit per job, and the
# CPUs and memory each search may use (jobs=1: one probe at a time in each job).
LAUNCHER=(
    hydra/launcher=submitit_slurm
    hydra.launcher.partition=debug
    hydra.launcher.timeout_min=30
    hydra.launcher.cpus_per_task=1
    hydra.launcher.mem_gb=4
)

say "docs/cluster.md's sweep: 2 models x 2 GPUs on SLURM, one PostgreSQL study each"
start=$SECONDS
set -x
"$PYTHON" -m autofit search -m model=tiny_sana,sana_600m gpu=a40,l40s backend=simulate \
    space=quick jobs=1 storage="$STORAGE" "${LAUNCHER[@]}" >sweep.out 2>sweep.err && status=0 || status=$?
{ set +x; } 2>/dev/null
quiet() { grep -v "Bypassing sacct\|accounting storage is disabled" "$@" || true; }
quiet sweep.err
echo "exit status: $status, after $((SECONDS - start)) s"
# Each job's output is in its submitit log (the sweep's own stdout has none of it).
for log in results/multirun/*/.submitit/*/*_log.out; do
    grep -h "^searching\|probes (" "$log"
done
[[ $status == 0 ]] || { echo "the sweep failed" >&2; exit 1; }

say "a sweep with a job that fails at run time (its space file is not there)"
start=$SECONDS
set -x
"$PYTHON" -m autofit search -m model=tiny_sana space=quick,missing.yaml backend=simulate \
    jobs=1 storage="$STORAGE" "${LAUNCHER[@]}" >failing.out 2>failing.err && status=0 || status=$?
{ set +x; } 2>/dev/null
quiet failing.err
echo "exit status: $status, after $((SECONDS - start)) s"
grep -q "1 of 2 jobs of the sweep failed: .*space=missing.yaml.* (exit 2)" failing.err || {
    echo "the failed job was not reported" >&2
    exit 1
}

say "trials per study in PostgreSQL"
"$PG_BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres autofit -c "
    select s.study_name as study, t.state, count(*) as trials
    from trials t join studies s using (study_id)
    group by s.study_name, t.state order by 1, 2"
say "sweep folders"
find results/multirun -mindepth 2 -maxdepth 2 -not -name .submitit | sort
