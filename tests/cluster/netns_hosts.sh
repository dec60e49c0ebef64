# Sourced: hosts emulated on this machine as network namespaces, for test_netns.sh and
# bench/emulated_hosts.sh. Each host gets its own namespace with an address in 192.0.2.0/24
# (the documentation range, used only inside these namespaces), and a veth to a bridge that
# lives in a namespace of its own. netns_agent.sh plays ssh into them for mpirun.
#
#   netns_create WORK PREFIX SLOTS HOST...   sets NETNS_BRIDGE, writes WORK/hosts (names for
#                                            the agent) and WORK/hostfile (SLOTS per host);
#                                            returns 1 with the reason in NETNS_ERROR
#   netns_destroy                            kills what runs inside, deletes the namespaces
#   netns_bytes HOST                         bytes HOST sent + received over its link
#   netns_shape HOST RATE                    token-bucket limit (e.g. 1gbit) on both
#                                            directions of HOST's link
#   netns_bench_hosts TAG SLOTS              a benchmark's h1 and h2 (SLOTS each): sets `work`
#                                            (a fresh directory) and `prefix`, exports
#                                            DDP_NETNS_PREFIX/DDP_NETNS_HOSTS, and removes
#                                            both when the script exits; exits 1 saying why
#                                            when the hosts cannot be made
NETNS_CREATED=()
NETNS_PREFIX=
NETNS_BRIDGE=
NETNS_ERROR=
#   netns_launch RANKS PER_HOST COMMAND...  COMMAND's ranks started by ddprun on those hosts,
#                                            as a user logged in on h1 would (ssh: the agent);
#                                            the caller's DDP_* and OMP_* settings go along
#                                            (OMP_NUM_THREADS 1 unless set); ddp's "ddp:" lines
#                                            are left out of the output

_netns_add() {
  NETNS_ERROR=$(ip netns add "$1" 2>&1) || { NETNS_ERROR="cannot create network namespaces here: $NETNS_ERROR"; return 1; }
  NETNS_CREATED+=("$1")
  ip -n "$1" link set lo up
}

netns_create() {
  local work=$1 prefix=$2 slots=$3 i host
  shift 3
  NETNS_PREFIX=$prefix
  NETNS_BRIDGE=${prefix}br
  _netns_add "$NETNS_BRIDGE" || return 1
  NETNS_ERROR=$(ip -n "$NETNS_BRIDGE" link add br0 type bridge 2>&1) ||
    { NETNS_ERROR="cannot create a bridge: $NETNS_ERROR"; return 1; }
  ip -n "$NETNS_BRIDGE" link set br0 up
  printf '127.0.0.1 localhost\n' > "$work/hosts"
  : > "$work/hostfile"
  i=0
  for host in "$@"; do
    i=$((i + 1))
    _netns_add "$prefix$host" || return 1
    # The bridge end is named after the host; the host end is its eth0.
    NETNS_ERROR=$(ip -n "$NETNS_BRIDGE" link add "$host" type veth peer name eth0 netns "$prefix$host" 2>&1) ||
      { NETNS_ERROR="cannot create veth pairs: $NETNS_ERROR"; return 1; }
    ip -n "$NETNS_BRIDGE" link set "$host" master br0 up
    ip -n "$prefix$host" addr add "192.0.2.$i/24" dev eth0
    ip -n "$prefix$host" link set eth0 up
    echo "192.0.2.$i $host" >> "$work/hosts"
    echo "$host slots=$slots" >> "$work/hostfile"
  done
}

netns_destroy() {
  local ns pid
  for ns in "${NETNS_CREATED[@]}"; do
    for pid in $(ip netns pids "$ns" 2> /dev/null); do kill -KILL "$pid" 2> /dev/null || true; done
    ip netns del "$ns" 2> /dev/null || true
  done
  NETNS_CREATED=()
}

netns_bytes() {
  local dir=/sys/class/net/$1/statistics
  ip netns exec "$NETNS_BRIDGE" sh -c "echo \$((\$(cat $dir/rx_bytes) + \$(cat $dir/tx_bytes)))"
}

# The bridge side's egress is what the host receives; the host's eth0 egress is what it sends.
netns_shape() {
  local host=$1 rate=$2
  tc -n "$NETNS_BRIDGE" qdisc replace dev "$host" root tbf rate "$rate" burst 256kb latency 100ms
  tc -n "$NETNS_PREFIX$host" qdisc replace dev eth0 root tbf rate "$rate" burst 256kb latency 100ms
}

netns_bench_hosts() {
  work=$(mktemp -d "/tmp/ddp-bench-$1.XXXXXX")
  prefix=ddp${1:0:1}$$-
  trap 'netns_destroy; rm -rf "$work"' EXIT
  trap 'exit 1' INT TERM
  netns_create "$work" "$prefix" "$2" h1 h2 || { echo "emulated hosts: $NETNS_ERROR" >&2; exit 1; }
  export DDP_NETNS_PREFIX=$prefix DDP_NETNS_HOSTS=$work/hosts
}

NETNS_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
netns_launch() {
  local ranks=$1 per_host=$2 line var passed=(OMP_NUM_THREADS=1)
  local agent=$NETNS_ROOT/tests/cluster/netns_agent.sh
  shift 2
  # The agent starts h1's shell with a fresh environment, as sshd would: the settings are passed
  # on explicitly, as a user would export them on h1; ddprun then forwards them to the ranks.
  for var in $(compgen -e | grep -E '^(DDP_|OMP_|MALLOC_|GLIBC_TUNABLES$)' || true); do passed+=("$var=${!var}"); done
  printf -v line '%q ' env "${passed[@]}" OMPI_MCA_plm_rsh_agent="$agent" \
    OMPI_MCA_plm_rsh_no_tree_spawn=1 MASTER_ADDR=192.0.2.1 "$NETNS_ROOT/launch/ddprun" \
    --hostfile "$work/hostfile" --iface eth0 -n "$ranks" -t "${OMP_NUM_THREADS:-1}" -x MASTER_ADDR "$@"
  "$agent" h1 "cd $(printf %q "$work") && $line" 2>&1 | grep -v '^ddp:'
}
