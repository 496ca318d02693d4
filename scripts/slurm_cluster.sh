#!/usr/bin/env bash
# scripts/slurm_cluster.sh -- bring up / stop / query a real local Slurm cluster (Debian's packages) on this host.
#
#   bash scripts/slurm_cluster.sh start [--nodes N]   # idempotent; N in 1..4 emulated nodes (default 1)
#   bash scripts/slurm_cluster.sh stop                # stops daemons by their pid files only; idempotent
#   bash scripts/slurm_cluster.sh status              # prints sinfo; exit 0 if up, 1 if not
#
# Uses the machine-wide config /etc/slurm/slurm.conf (what a plain `sbatch` reads), logs in /var/log/slurm/,
# state in /var/spool/slurmctld and /var/spool/slurmd/<node>. Must run as root. Without slurmdbd there is no
# sacct: use squeue for status (MinJobAge=300 keeps finished jobs visible to it).
#
# Measured facts it relies on (see /work/shared/notes/local-slurm.md; Debian bookworm, Slurm 22.05.8, no systemd):
# - `apt-get install munge slurmctld slurmd slurm-client` (~13 s); the packages cannot start services without
#   systemd, so /run/munge and /run/slurm are created here and munged -> slurmctld -> slurmd are started by hand;
#   each daemonises and writes a pid file, and stop uses those pids and nothing broader.
# - proctrack/linuxproc + task/none need no cgroup setup; DefMemPerCPU=500 stops one job taking a whole node;
#   the SchedulerParameters below make a trivial sbatch finish in ~1 s (not ~3 s); AuthInfo=cred_expire=10 lets
#   a requeued job restart after ~11 s (not ~120 s). The host name must resolve (added to /etc/hosts if not).
# - Several slurmd on one host work: NodeName=n[1-N] NodeHostname=<host> Port=[17001-...], %n in the slurmd
#   spool/pid/log paths, `slurmd -N nK` each. Nodes oversubscribe the real memory; fine for tests.
# - The cluster is machine-wide (ports 6817/6818/17001+): concurrent users see each other's jobs.
set -euo pipefail

CONF=/etc/slurm/slurm.conf
LOGDIR=/var/log/slurm
RUNDIR=/run/slurm
STATEDIR=/var/spool/slurmctld
SPOOLDIR=/var/spool/slurmd
MUNGE_PID=/run/munge/munged.pid
CTLD_PID=$RUNDIR/slurmctld.pid
PKGS=(munge slurmctld slurmd slurm-client)
HOST=$(hostname -s)

say() { echo "slurm_cluster: $*"; }
die() { echo "slurm_cluster: ERROR: $*" >&2; exit 1; }

# pid from a pid file if it is a live (non-zombie) munged/slurmctld/slurmd, else fail. PID 1 here does not
# reap orphans, so stopped daemons linger as zombies; a reused pid of another program is never signalled.
live_pid() {
  local pid st
  pid=$(tr -dc '0-9' 2>/dev/null <"$1") && [[ -n $pid ]] || return 1
  st=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ $st =~ ^$pid\ \((munged|slurmctld|slurmd)\)\ [^Z] ]] || return 1
  echo "$pid"
}

node_names() {  # node names for N nodes
  if (($1 == 1)); then echo "$HOST"; else for ((k = 1; k <= $1; k++)); do echo "n$k"; done; fi
}

install_packages() {
  local missing=() p
  for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  local t0=$SECONDS
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null
  say "Installed ${missing[*]} ($((SECONDS - t0)) s)"
}

write_conf() {  # $1 = node count; prints the slurm.conf text
  local n=$1 hw
  # CPU topology from slurmd -C (fallback nproc/free); emulated nodes get a modest RealMemory each.
  hw=$(slurmd -C 2>/dev/null | head -n1 | sed -E 's/^NodeName=[^ ]+ //') || hw=""
  [[ $hw == *CPUs=* ]] || hw="CPUs=$(nproc) RealMemory=$(free -m | awk '/^Mem:/{print $2}')"
  cat <<EOF
# Written by trainflow scripts/slurm_cluster.sh (--nodes $n); rewritten on every start.
ClusterName=trainflow
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
AuthInfo=cred_expire=10
StateSaveLocation=$STATEDIR
SlurmctldPidFile=$CTLD_PID
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdSpoolDir=$SPOOLDIR/%n
SlurmdPidFile=$RUNDIR/slurmd-%n.pid
SlurmdLogFile=$LOGDIR/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
ReturnToService=2
JobRequeue=1
MinJobAge=300
SchedulerParameters=batch_sched_delay=0,sched_interval=2,sched_min_interval=20000,bf_interval=5
EOF
  if ((n == 1)); then
    echo "NodeName=$HOST NodeAddr=127.0.0.1 $hw State=UNKNOWN"
  else
    hw=$(sed -E 's/RealMemory=[0-9]+/RealMemory=4000/' <<<"$hw")
    [[ $hw == *RealMemory=* ]] || hw="$hw RealMemory=4000"
    echo "NodeName=n[1-$n] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=[17001-$((17000 + n))] $hw State=UNKNOWN"
  fi
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
}

all_running() {  # $1 = node count
  local nd
  live_pid "$MUNGE_PID" >/dev/null && live_pid "$CTLD_PID" >/dev/null || return 1
  for nd in $(node_names "$1"); do live_pid "$RUNDIR/slurmd-$nd.pid" >/dev/null || return 1; done
}

stop_one() {  # $1 = pid file, $2 = label
  local pid i
  if pid=$(live_pid "$1"); then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 150; i++)); do live_pid "$1" >/dev/null || break; sleep 0.2; done
    if live_pid "$1" >/dev/null; then kill -KILL "$pid" 2>/dev/null || true; sleep 0.5; say "Killed $2 (pid $pid) after 30 s"
    else say "Stopped $2 (pid $pid)"; fi
  fi
  rm -f "$1"
}

cmd_stop() {
  local f
  for f in "$RUNDIR"/slurmd-*.pid; do [[ -e $f ]] && stop_one "$f" "$(basename "$f" .pid)"; done
  stop_one "$CTLD_PID" slurmctld
  stop_one "$MUNGE_PID" munged
  say "Stopped (nothing left running from pid files)"
}

nodes_ready() {  # $1 = node count; true when every node is idle/mix/alloc and responding
  local states
  states=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u) || return 1
  [[ $(grep -cE ' (idle|mix|alloc)$' <<<"$states") -eq $1 && $(wc -l <<<"$states") -eq $1 ]]
}

wait_ready() {  # $1 = node count; up to 60 s
  local deadline=$((SECONDS + 60))
  until nodes_ready "$1"; do
    ((SECONDS < deadline)) || { sinfo -N >&2 || true
      die "nodes not idle after 60 s; read $LOGDIR/slurmctld.log and $LOGDIR/slurmd-<node>.log"; }
    sleep 0.5
  done
}

cmd_start() {
  local n=1 t0=$SECONDS pid nd new
  while (($#)); do
    case $1 in
      --nodes) n=${2:-}; shift 2 || die "--nodes needs a value" ;;
      --nodes=*) n=${1#*=}; shift ;;
      *) die "unknown option: $1" ;;
    esac
  done
  [[ $n =~ ^[1-4]$ ]] || die "--nodes must be 1..4 (got '$n')"
  ((EUID == 0)) || die "must run as root"
  install_packages
  new=$(write_conf "$n")
  if all_running "$n" && [[ -f $CONF && $(cat "$CONF") == "$new" ]]; then
    wait_ready "$n" && say "Already running with $n node(s); nothing to do"; return 0
  fi
  if live_pid "$CTLD_PID" >/dev/null || compgen -G "$RUNDIR/slurmd-*.pid" >/dev/null; then
    say "Restarting: running cluster differs from --nodes $n or is incomplete"; cmd_stop
  fi

  getent hosts "$HOST" >/dev/null || { echo "127.0.0.1 $HOST" >>/etc/hosts; say "Added $HOST to /etc/hosts"; }
  if ((n > 1)); then  # emulated node names must resolve: torch.distributed's master address is the first node
    for nd in $(node_names "$n"); do
      getent hosts "$nd" >/dev/null || { echo "127.0.0.1 $nd" >>/etc/hosts; say "Added $nd to /etc/hosts"; }
    done
  fi
  install -d -m 0755 -o slurm -g slurm "$RUNDIR" "$LOGDIR" "$STATEDIR"
  install -d -m 0755 "$SPOOLDIR" /etc/slurm
  for nd in $(node_names "$n"); do install -d -m 0755 "$SPOOLDIR/$nd"; done
  install -d -m 0755 -o munge -g munge /run/munge
  printf '%s\n' "$new" >"$CONF.tmp" && chmod 0644 "$CONF.tmp" && mv "$CONF.tmp" "$CONF"
  say "Wrote $CONF ($n node(s): $(node_names "$n" | paste -sd, -))"

  if [[ ! -s /etc/munge/munge.key ]]; then
    su -s /bin/sh munge -c 'mungekey --create --keyfile=/etc/munge/munge.key'
    say "Created /etc/munge/munge.key"
  fi
  chown munge:munge /etc/munge /etc/munge/munge.key && chmod 0700 /etc/munge && chmod 0400 /etc/munge/munge.key
  if ! pid=$(live_pid "$MUNGE_PID"); then
    su -s /bin/sh munge -c /usr/sbin/munged
    for _ in {1..50}; do pid=$(live_pid "$MUNGE_PID") && break; sleep 0.1; done
    [[ -n ${pid:-} ]] || die "munged did not start; read /var/log/munge/munged.log"
    say "Started munged (pid $pid)"
  fi
  munge -n | unmunge >/dev/null || die "munge self-test failed; read /var/log/munge/munged.log"

  if ! pid=$(live_pid "$CTLD_PID"); then
    slurmctld || die "slurmctld failed to start; read $LOGDIR/slurmctld.log"
    pid=""; for _ in {1..100}; do pid=$(live_pid "$CTLD_PID") && scontrol ping >/dev/null 2>&1 && break; sleep 0.2; done
    [[ -n $pid ]] && scontrol ping >/dev/null 2>&1 || die "slurmctld not answering; read $LOGDIR/slurmctld.log"
    say "Started slurmctld (pid $pid)"
  fi
  for nd in $(node_names "$n"); do
    if ! pid=$(live_pid "$RUNDIR/slurmd-$nd.pid"); then
      slurmd -N "$nd" || die "slurmd -N $nd failed to start; read $LOGDIR/slurmd-$nd.log"
      pid=""; for _ in {1..50}; do pid=$(live_pid "$RUNDIR/slurmd-$nd.pid") && break; sleep 0.1; done
      [[ -n $pid ]] || die "slurmd $nd wrote no pid file; read $LOGDIR/slurmd-$nd.log"
      say "Started slurmd $nd (pid $pid)"
    fi
  done

  wait_ready "$n"
  say "Cluster up: $n node(s) idle in partition debug ($((SECONDS - t0)) s)"
}

cmd_status() {
  if live_pid "$CTLD_PID" >/dev/null && sinfo 2>/dev/null; then
    if sinfo -h -N -o '%t' | grep -qE '^(idle|mix|alloc)$'; then exit 0; fi
  fi
  echo "slurm_cluster: not up" >&2; exit 1
}

case ${1:-} in
  start) shift; cmd_start "$@" ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) echo "usage: $0 start [--nodes N] | stop | status" >&2; exit 2 ;;
esac
