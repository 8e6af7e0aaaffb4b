#!/bin/bash
# A real Slurm cluster of two (or three) nodes on one machine, for tests/test_multinode*.py.
# Debian's slurm-wlm (22.05) + munge; one slurmctld on the host; one slurmd per node, each in its own
# network namespace (its own address on a private bridge) and its own UTS namespace (its own host
# name), so that inside a task gethostname() is the node's name and resolves to the node's address:
# gloo and torch's TCPStore then bind where a real cluster's would, with no per-node interface setting.
# From ../shared/recipes/slurm-2node.sh (start slurmd with nsenter --net, not `ip netns exec`, which
# remounts /sys without cgroups and slurmd 22.05 refuses to start).  Root only; CI (.ci/run) runs it.
#   bash tests/cluster/slurm-2node.sh up [NODES]   # NODES 2 (default) or 3; about 20 s
#   bash tests/cluster/slurm-2node.sh down
# Site policy stand-in: a TaskProlog that unsets, in tasks on node N, the variables listed in
# $D/unset-on-cdnodeN (one name a line): how a variable exported on the submit host can miss a node.
# Addresses are private to the namespaces this script makes; nothing leaves the machine.
set -eu
B=cdbr0 NET=10.77.0 D=${SLURM_TEST_DIR:-/tmp/commdiag-slurm}
up() {
  n=${1:-2}
  command -v slurmctld >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null; }
  mkdir -p $D/state $D/spool $D/log /etc/slurm /run/munge /etc/munge /var/lib/munge /var/log/munge
  [ -s /etc/munge/munge.key ] || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
  chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge; chmod 400 /etc/munge/munge.key
  pgrep -x munged >/dev/null || runuser -u munge -- munged
  ip link add $B type bridge 2>/dev/null || true; ip addr add $NET.1/24 dev $B 2>/dev/null || true; ip link set $B up
  nodes=""
  for i in $(seq 1 "$n"); do
    ip netns add cdn$i 2>/dev/null || true
    ip link add cdv$i type veth peer name cdp$i 2>/dev/null && ip link set cdp$i netns cdn$i || true
    ip link set cdv$i master $B; ip link set cdv$i up
    ip netns exec cdn$i ip addr add $NET.1$i/24 dev cdp$i 2>/dev/null || true
    ip netns exec cdn$i ip link set cdp$i up; ip netns exec cdn$i ip link set lo up
    grep -q " cdnode$i$" /etc/hosts || printf "$NET.1$i cdnode$i\n" >> /etc/hosts
    nodes="$nodes
NodeName=cdnode$i NodeAddr=$NET.1$i CPUs=1 RealMemory=1000 State=UNKNOWN"
  done
  cat > $D/prolog.sh <<'P'
#!/bin/sh
f="${SLURM_TEST_DIR:-/tmp/commdiag-slurm}/unset-on-$SLURMD_NODENAME"
[ -f "$f" ] && while read -r v; do [ -n "$v" ] && echo "unset $v"; done < "$f"
exit 0
P
  sed -i "s#\${SLURM_TEST_DIR:-/tmp/commdiag-slurm}#$D#" $D/prolog.sh; chmod 755 $D/prolog.sh
  h=$(hostname -s)
  cat > /etc/slurm/slurm.conf <<C
ClusterName=cdtest
SlurmctldHost=$h($NET.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldLogFile=$D/log/ctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
SlurmdPidFile=$D/slurmd-%n.pid
SlurmctldPidFile=$D/slurmctld.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TaskProlog=$D/prolog.sh
SelectType=select/cons_tres
SchedulerType=sched/builtin
ReturnToService=2
MpiDefault=none
KillWait=5
$nodes
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
C
  slurmctld -i
  for i in $(seq 1 "$n"); do
    nsenter --net=/var/run/netns/cdn$i unshare --uts sh -c "hostname cdnode$i && exec slurmd -N cdnode$i"
  done
  for _ in $(seq 40); do [ "$(sinfo -h -N -o %T 2>/dev/null | grep -c idle)" = "$n" ] && break; sleep 1; done
  sinfo -N
}
down() {
  for f in $D/slurmd-cdnode*.pid $D/slurmctld.pid; do [ -s "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
  sleep 1
  for i in 1 2 3; do ip netns del cdn$i 2>/dev/null || true; done
  ip link del $B 2>/dev/null || true
  sed -i '/ cdnode[0-9]$/d' /etc/hosts
  rm -rf "$D"
}
"$@"
