#!/bin/sh
# What ssh is for mpirun between real hosts, for the network-namespace hosts of test_netns.sh:
#
#   netns_agent.sh [ssh options] HOST COMMAND...
#
# runs COMMAND on HOST, i.e. inside the network namespace $DDP_NETNS_PREFIX$HOST, under the
# hostname HOST (its own UTS namespace, so Open MPI's per-host files stay apart) with the hosts
# file $DDP_NETNS_HOSTS in place of /etc/hosts (a bind mount, private to that command), and with
# a fresh environment as sshd would give: only what mpirun passes on reaches the ranks there.
# Open MPI calls it through --mca plm_rsh_agent; the command is one string to run with sh -c
# ("$*"), as sshd runs it. Like ssh it needs the host's network: a host whose link (its eth0) is
# down does not answer (status 255, ssh's), which is how a network partition looks to mpirun and
# to ddprun.
set -eu
while [ $# -gt 0 ]; do
  case "$1" in
    -*) shift ;;  # ssh options (Open MPI passes none to an agent it does not know)
    *) break ;;
  esac
done
[ $# -ge 2 ] || { echo "usage: netns_agent.sh [ssh options] HOST COMMAND..." >&2; exit 255; }
host=$1
shift
ip -n "${DDP_NETNS_PREFIX:?}$host" link show eth0 2> /dev/null | grep -q 'state UP' ||
  { echo "netns_agent.sh: $host does not answer: its link is down, or it is gone" >&2; exit 255; }
exec ip netns exec "${DDP_NETNS_PREFIX:?}$host" unshare --uts \
  env -i PATH="$PATH" HOME="${HOME:-/root}" \
  sh -c 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec sh -c "$*"' \
  netns_agent "$host" "${DDP_NETNS_HOSTS:?}" "$@"
