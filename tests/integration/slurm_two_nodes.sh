#!/usr/bin/env bash
# slurm_two_nodes.sh up|down DIR — a private two-node SLURM cluster on this host for test_slurm_multinode.py:
# Slurm's multiple-slurmd mode (two `slurmd -N n1|n2` with their own Port, one slurmctld on port 6917, its own munged
# socket, no accounting), selected with SLURM_CONF=DIR/etc/slurm.conf; /etc/slurm and any other cluster stay untouched.
#   tests/integration/slurm_two_nodes.sh up /tmp/slurm2 && SLURM_CONF=/tmp/slurm2/etc/slurm.conf \
#     python -m pytest tests/integration/test_slurm_multinode.py
#   tests/integration/slurm_two_nodes.sh down /tmp/slurm2     (stops only the daemons it started, by recorded PID)
set -euo pipefail
cmd=${1:?up|down}; D=$(realpath -m "${2:?state dir}")
H=$(hostname -s)
start() { # start NAME CMD...: a daemon in the foreground of its own session; its PID recorded in D/NAME.pid
  local name=$1; shift
  setsid nohup "$@" > "$D/log/$name.out" 2>&1 < /dev/null &
  echo $! > "$D/$name.pid"
}
case $cmd in
up)
  mkdir -p "$D"/{etc,state,spooln1,spooln2,log,munge}
  chmod 755 "$D" "$D/munge"; chown munge:munge "$D/munge"
  cat > "$D/etc/slurm.conf" <<CONF
ClusterName=twonode
SlurmctldHost=$H(127.0.0.1)
SlurmctldPort=6917
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/munge.socket.2
MpiDefault=none
MailProg=/bin/true
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool%n
SlurmctldPidFile=$D/slurmctld.daemon.pid
SlurmdPidFile=$D/slurmd-%n.daemon.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=300
KillWait=5
InactiveLimit=0
NodeName=n1 NodeHostname=$H NodeAddr=127.0.0.1 Port=6921 CPUs=2 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=4000
NodeName=n2 NodeHostname=$H NodeAddr=127.0.0.1 Port=6922 CPUs=2 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=4000
PartitionName=two Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
CONF
  : > "$D/etc/gres.conf"
  start munged setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged --foreground \
    --socket="$D/munge/munge.socket.2" --pid-file="$D/munge/munged.pid" --seed-file="$D/munge/seed"
  sleep 1
  export SLURM_CONF=$D/etc/slurm.conf
  start slurmctld /usr/sbin/slurmctld -D -f "$SLURM_CONF"
  sleep 2
  start slurmd-n1 /usr/sbin/slurmd -D -f "$SLURM_CONF" -N n1
  start slurmd-n2 /usr/sbin/slurmd -D -f "$SLURM_CONF" -N n2
  for _ in $(seq 60); do [ "$(sinfo -h -o %D -t idle 2>/dev/null)" = 2 ] && break; sleep 0.5; done
  sinfo ;;
down)
  for name in slurmd-n1 slurmd-n2 slurmctld munged; do
    [ -f "$D/$name.pid" ] && kill "$(cat "$D/$name.pid")" 2>/dev/null || true
    rm -f "$D/$name.pid"
  done ;;
*) echo "usage: $0 up|down DIR" >&2; exit 2 ;;
esac
