#!/usr/bin/env bash
# A test bed of hosts on this machine, for multi-host work without a cluster.
#
#   testbed.sh up N [--rate RATE] [--pin]
#                                   hosts hvd-h1 .. hvd-hN (2 <= N <= 16); --pin gives each
#                                   host a core of its own (hvd-hi: core (i-1) mod cores)
#   testbed.sh down                 removes everything `up` made (safe to run any time)
#   testbed.sh exec HOST CMD...     runs CMD as on HOST (its network and its hostname)
#   testbed.sh status               the hosts that are up, their addresses and sshd
#   testbed.sh link HOST up|down    takes a host's link down (a network fault) or back up
#   testbed.sh rate HOST RATE|off   limits a host's outgoing traffic to RATE (tc tbf, e.g.
#                                   1mbit) while it runs, or lifts the limit
#   testbed.sh kill HOST            kills every process on HOST but its sshd (a host whose
#                                   job processes all died; the host itself stays up)
#   testbed.sh spark up [--cores C] [--gpus G] [--python PY]
#                                   a Spark standalone cluster: the master on hvd-h1, a worker
#                                   on every other host (C cores each, default 2; G fake GPUs
#                                   each, default 0); prints the master URL
#   testbed.sh spark worker HOST    (re)starts HOST's worker (after `kill HOST`, say)
#   testbed.sh spark down           stops the master, the workers and their executors
#   testbed.sh ray up [--cpus C] [--python PY]
#                                   a Ray cluster: the head on hvd-h1 (no CPUs: the driver's
#                                   host), a node on every other host (C CPUs, default 2), with
#                                   token authentication; prints the address and the token
#                                   file (clients set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN)
#   testbed.sh ray node HOST        restarts HOST's Ray node (after `kill HOST`, say)
#   testbed.sh ray down             stops every Ray process of the test bed
#
# Each host is a network namespace named after it with one interface, eth0, addressed
# 10.200.0.(10+i)/24 and plugged into a bridge that lives in a namespace of its own
# (hvd-net): no interface or address of the test bed exists outside namespaces it created.
# Each host runs an sshd on its address inside its own UTS namespace, so `ssh hvd-h2 hostname`
# prints hvd-h2, and Open MPI (which tells nodes apart by hostname) treats the hosts as
# separate nodes: TCP between hosts, shared memory only within one. Host names resolve through
# a marked block in /etc/hosts; ssh uses a key made for the test bed through a marked
# `Include` in ~/.ssh/config. From the machine itself (not on the test network) ssh reaches a
# host through `nsenter --net=... nc` (ProxyCommand); MPI jobs are started from a host
# (`testbed.sh exec hvd-h1 hvdrun -H hvd-h1:2,hvd-h2:2 ...`), as from a cluster's login node.
#
# The Spark cluster is pyspark's own (`spark-class` from the pyspark package of PY, default
# the repository's .venv/bin/python): each daemon runs in its host's namespaces, binds to its
# host's address (never loopback), and keeps its log and work directory under
# /run/hvd-testbed/spark. With --gpus G each worker finds G GPUs through a discovery script
# that reports fake addresses, different on each host (hvd-hN: 10N, 10N+1, ...), for testing
# GPU placement without GPUs.
#
# --pin: every process of host hvd-hi (its sshd, so what ssh starts there, and `exec`) runs on
# core (i-1) mod the machine's cores, as a host of its own would: without it the scheduler moves
# two hosts' ranks onto one core at times, which a benchmark then counts as network cost.
#
# --rate RATE limits every host's outgoing traffic with `tc qdisc ... tbf` (e.g. 1gbit,
# 10gbit): a link between two hosts then carries RATE each way. Needs root; installs
# iproute2, openssh-server, openssh-client and netcat-openbsd when missing.
set -euo pipefail

STATE=/run/hvd-testbed
NET_NS=hvd-net
SUBNET=10.200.0
HOSTS_BEGIN="# >>> hvd-testbed >>>"
HOSTS_END="# <<< hvd-testbed <<<"
SSH_CONFIG="$HOME/.ssh/config"

die() { echo "testbed: $*" >&2; exit 1; }

host_names() {  # the hosts that exist now, from their namespaces
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^hvd-h[0-9]+$' | sort -V || true
}

# Runs a command in a host's network namespace. nsenter, not `ip netns exec`: the latter also
# remounts /sys in a private mount namespace, which fails where / is not a mount point (a
# chroot, such as a fresh-machine check).
in_ns() { local ns=$1; shift; nsenter --net="/run/netns/$ns" "$@"; }

address_of() { echo "$SUBNET.$((10 + ${1#hvd-h}))"; }

install_packages() {
  local need=()
  { command -v ip && command -v tc; } >/dev/null || need+=(iproute2)
  [[ -x /usr/sbin/sshd ]] || need+=(openssh-server)
  command -v ssh >/dev/null || need+=(openssh-client)
  command -v nc >/dev/null || need+=(netcat-openbsd)
  command -v unshare >/dev/null || need+=(util-linux)
  [[ ${#need[@]} -eq 0 ]] && return 0
  echo "testbed: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Installing openssh-server must not start (or enable) the machine's own sshd.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null || {
    rm -f /usr/sbin/policy-rc.d; die "could not install ${need[*]}"; }
  rm -f /usr/sbin/policy-rc.d
}

remove_block() {  # remove_block FILE: drops the marked test-bed block, if any
  local file=$1
  [[ -f $file ]] || return 0
  grep -qF "$HOSTS_BEGIN" "$file" || return 0
  local tmp
  tmp=$(mktemp)
  awk -v b="$HOSTS_BEGIN" -v e="$HOSTS_END" '$0==b{skip=1;next} $0==e{skip=0;next} !skip' \
    "$file" > "$tmp"
  cat "$tmp" > "$file"  # keeps the file's inode, owner and mode
  rm -f "$tmp"
}

cmd_down() {
  local ns pid
  cmd_spark_down
  cmd_ray_down
  for ns in $(host_names) $(ip netns list 2>/dev/null | awk '{print $1}' | grep -x "$NET_NS" || true); do
    # Every process still in the namespace (sshd, sessions, ranks) goes with it.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns delete "$ns" 2>/dev/null || true
  done
  if [[ -d $STATE ]]; then
    for pidfile in "$STATE"/sshd-*.pid; do
      [[ -f $pidfile ]] && kill -KILL "$(cat "$pidfile")" 2>/dev/null || true
    done
    rm -rf "$STATE"
  fi
  remove_block /etc/hosts
  remove_block "$SSH_CONFIG"
  # `ip netns add` makes /run/netns a mount point of its own; with no namespace left in it,
  # undo that too (a chroot's copy would otherwise stay mounted after the chroot is gone).
  if [[ -d /run/netns ]] && [[ -z $(ls -A /run/netns 2>/dev/null) ]] &&
     grep -q " /run/netns " /proc/mounts 2>/dev/null; then
    umount /run/netns 2>/dev/null || umount -l /run/netns 2>/dev/null || true
  fi
}

parse_rate_bits() {  # 1gbit / 500mbit / 10gbit / 100kbit -> bits per second
  local r=${1,,}
  case "$r" in
    *gbit) echo $(( ${r%gbit} * 1000000000 )) ;;
    *mbit) echo $(( ${r%mbit} * 1000000 )) ;;
    *kbit) echo $(( ${r%kbit} * 1000 )) ;;
    *) die "--rate: expected a rate like 1gbit, 500mbit or 10gbit, got '$1'" ;;
  esac
}

cmd_up() {
  local n=${1:-}
  shift || true
  local rate="" pin=0
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --pin) pin=1; shift ;;
      --rate) rate=${2:-}; [[ -n $rate ]] || die "--rate needs a value"; shift 2 ;;
      --rate=*) rate=${1#--rate=}; shift ;;
      *) die "up: unknown argument '$1'" ;;
    esac
  done
  [[ $n =~ ^[0-9]+$ ]] && (( n >= 2 && n <= 16 )) || die "up: N must be 2..16, got '${n}'"
  [[ $(id -u) -eq 0 ]] || die "needs root (network namespaces)"
  local bits=0
  [[ -n $rate ]] && bits=$(parse_rate_bits "$rate")
  install_packages
  cmd_down
  UP_DONE=0
  trap '[[ $UP_DONE == 1 ]] || cmd_down' EXIT  # a failed `up` leaves nothing behind

  mkdir -p "$STATE" /run/sshd "$(dirname "$SSH_CONFIG")"
  chmod 700 "$STATE"
  ssh-keygen -q -t ed25519 -N "" -C hvd-testbed -f "$STATE/id_ed25519"
  ssh-keygen -q -t ed25519 -N "" -C hvd-testbed-host -f "$STATE/ssh_host_ed25519_key"
  cp "$STATE/id_ed25519.pub" "$STATE/authorized_keys"

  ip netns add "$NET_NS"
  in_ns "$NET_NS" ip link add hvdbr0 type bridge
  in_ns "$NET_NS" ip link set hvdbr0 up
  in_ns "$NET_NS" ip link set lo up

  {
    echo "$HOSTS_BEGIN"
    for i in $(seq 1 "$n"); do echo "$(address_of "hvd-h$i") hvd-h$i"; done
    echo "$HOSTS_END"
  } >> /etc/hosts

  for i in $(seq 1 "$n"); do
    local h="hvd-h$i" addr
    addr=$(address_of "$h")
    ip netns add "$h"
    # The veth pair is created straight into the two namespaces: nothing in the machine's.
    ip link add "vh$i" netns "$NET_NS" type veth peer name eth0 netns "$h"
    in_ns "$NET_NS" ip link set "vh$i" master hvdbr0 up
    in_ns "$h" ip link set lo up
    in_ns "$h" ip addr add "$addr/24" dev eth0
    in_ns "$h" ip link set eth0 up
    if (( bits > 0 )); then
      # Burst: 10 ms at the rate (at least 64 KiB), so the bucket refills between timer ticks.
      local burst=$(( bits / 8 / 100 ))
      (( burst < 65536 )) && burst=65536
      in_ns "$h" tc qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms
    fi
    cat > "$STATE/sshd_config.$h" <<EOF
ListenAddress $addr
Port 22
HostKey $STATE/ssh_host_ed25519_key
AuthorizedKeysFile $STATE/authorized_keys
PidFile $STATE/sshd-$h.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxStartups 64
MaxSessions 64
# A session whose client is cut off (the host's link down) ends within ~10 s instead of
# retransmitting for many minutes: what a cluster's sshd should do too (docs/hosts.md).
ClientAliveInterval 3
ClientAliveCountMax 3
EOF
    local pin_to=()
    if (( pin )); then
      echo $(( (i - 1) % $(nproc) )) > "$STATE/cpu-$h"
      pin_to=(taskset -c "$(cat "$STATE/cpu-$h")")
    fi
    in_ns "$h" "${pin_to[@]}" unshare --uts sh -c "hostname $h && exec /usr/sbin/sshd -f $STATE/sshd_config.$h -E $STATE/sshd-$h.log"
  done

  cat > "$STATE/ssh_config" <<EOF
Host hvd-h*
  User root
  IdentityFile $STATE/id_ed25519
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  ConnectTimeout 10
  BatchMode yes
Match host hvd-h* exec $STATE/outside-testbed
  ProxyCommand nsenter --net=/run/netns/%h nc %h 22
EOF
  # True in a process that is in none of the test bed's network namespaces.
  printf '#!/bin/sh\n[ -z "$(ip netns identify 2>/dev/null)" ]\n' > "$STATE/outside-testbed"
  chmod +x "$STATE/outside-testbed"
  # Include must come before any Host block of the user's own config to apply everywhere.
  local tmp
  tmp=$(mktemp)
  { echo "$HOSTS_BEGIN"; echo "Include $STATE/ssh_config"; echo "$HOSTS_END";
    [[ -f $SSH_CONFIG ]] && cat "$SSH_CONFIG"; } > "$tmp"
  [[ -f $SSH_CONFIG ]] || { touch "$SSH_CONFIG"; chmod 600 "$SSH_CONFIG"; }
  cat "$tmp" > "$SSH_CONFIG"
  rm -f "$tmp"

  # Every sshd answers before `up` returns (bounded: 50 tries, 0.1 s apart, per host).
  for i in $(seq 1 "$n"); do
    local ok=0
    for _ in $(seq 1 50); do
      if [[ $(ssh "hvd-h$i" hostname 2>/dev/null) == "hvd-h$i" ]]; then ok=1; break; fi
      sleep 0.1
    done
    (( ok )) || die "hvd-h$i: sshd does not answer (log: $STATE/sshd-hvd-h$i.log)"
  done
  UP_DONE=1
  echo "testbed: $n hosts up (hvd-h1..hvd-h$n, $SUBNET.11-$((10 + n))${rate:+, $rate links})"
}

cmd_exec() {
  local h=${1:-}
  shift || true
  [[ -n $h && $# -gt 0 ]] || die "usage: testbed.sh exec HOST CMD..."
  ip netns list | awk '{print $1}' | grep -qx "$h" || die "no test host '$h' (testbed.sh up N)"
  local pin_to=()
  [[ -f $STATE/cpu-$h ]] && pin_to=(taskset -c "$(cat "$STATE/cpu-$h")")
  exec "${pin_to[@]}" nsenter --net="/run/netns/$h" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$h" "$@"
}

cmd_link() {
  local h=${1:-} state=${2:-}
  [[ $state == up || $state == down ]] || die "usage: testbed.sh link HOST up|down"
  in_ns "$h" ip link set eth0 "$state"
}

cmd_rate() {
  local h=${1:-} rate=${2:-}
  [[ -n $h && -n $rate ]] || die "usage: testbed.sh rate HOST RATE|off"
  ip netns list | awk '{print $1}' | grep -qx "$h" || die "no test host '$h'"
  if [[ $rate == off ]]; then
    in_ns "$h" tc qdisc del dev eth0 root 2>/dev/null || true
    return 0
  fi
  local bits
  bits=$(parse_rate_bits "$rate") || die "rate '$rate' is not a tc rate such as 1mbit or 10gbit"
  local burst=$(( bits / 8 / 100 ))
  (( burst < 65536 )) && burst=65536
  in_ns "$h" tc qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms
}

cmd_kill() {
  local h=${1:-} keep="" pid
  [[ -n $h ]] || die "usage: testbed.sh kill HOST"
  ip netns list | awk '{print $1}' | grep -qx "$h" || die "no test host '$h'"
  [[ -f $STATE/sshd-$h.pid ]] && keep=$(cat "$STATE/sshd-$h.pid")
  for pid in $(ip netns pids "$h" 2>/dev/null); do
    [[ $pid == "$keep" ]] || kill -KILL "$pid" 2>/dev/null || true
  done
}

cmd_status() {
  local h
  for h in $(host_names); do
    local pid=""
    [[ -f $STATE/sshd-$h.pid ]] && pid=$(cat "$STATE/sshd-$h.pid")
    printf '%s %s sshd=%s %s\n' "$h" "$(address_of "$h")" "${pid:-none}" \
      "$(in_ns "$h" tc qdisc show dev eth0 2>/dev/null | grep -o 'rate [^ ]*' || true)"
  done
}


# ---- a Spark standalone cluster on the test bed ---------------------------------------------
SPARK_STATE=$STATE/spark
SPARK_MASTER_PORT=7077
SPARK_MASTER_UI=8080

spark_home() {  # SPARK_HOME of the pyspark package of $SPARK_PY
  "$SPARK_PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null ||
    die "spark: $SPARK_PY cannot import pyspark (scripts/setup_venv.sh --spark installs it)"
}

# spark_daemon HOST NAME ARGS...: runs spark-class ARGS in HOST's namespaces as a daemon in a
# session of its own; its pid goes to $SPARK_STATE/NAME.pid and its output to NAME.log.
spark_daemon() {
  local h=$1 name=$2
  shift 2
  local addr
  addr=$(address_of "$h")
  SPARK_LOCAL_IP=$addr SPARK_LOCAL_HOSTNAME=$h SPARK_HOME=$SPARK_HOME_DIR \
    SPARK_DAEMON_MEMORY=${SPARK_DAEMON_MEMORY:-384m} SPARK_LOG_DIR=$SPARK_STATE \
    PYSPARK_PYTHON=$SPARK_PY SPARK_WORKER_OPTS="${WORKER_OPTS:-}" \
    setsid nsenter --net="/run/netns/$h" unshare --uts sh -c \
    'hostname "$0" && exec "$@"' "$h" "$SPARK_HOME_DIR/bin/spark-class" "$@" \
    > "$SPARK_STATE/$name.log" 2>&1 < /dev/null &
  echo $! > "$SPARK_STATE/$name.pid"
}

spark_stop() {  # spark_stop NAME: the daemon, its session (a worker's executors) and below
  local pidfile=$SPARK_STATE/$1.pid pid
  [[ -f $pidfile ]] || return 0
  pid=$(cat "$pidfile")
  local tree
  tree=$(spark_tree "$pid")
  kill -TERM $tree 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL $tree $(spark_tree "$pid") 2>/dev/null || true
  rm -f "$pidfile"
}

spark_tree() {  # spark_tree PID: PID and every process below it
  local pid=$1 child
  echo "$pid"
  for child in $(pgrep -P "$pid" 2>/dev/null); do spark_tree "$child"; done
}

wait_for_log() {  # wait_for_log FILE TEXT SECONDS
  local file=$1 text=$2 limit=$3 i
  for ((i = 0; i < limit * 10; i++)); do
    grep -qF -- "$text" "$file" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

spark_worker() {  # spark_worker HOST: (re)starts HOST's worker and waits for it to register
  local h=$1 addr
  addr=$(address_of "$h")
  spark_stop "worker-$h"
  local master_log=$SPARK_STATE/master.log before
  before=$(grep -c "Registering worker $addr:" "$master_log" 2>/dev/null || true)
  local opts="" gpus
  gpus=$(cat "$SPARK_STATE/gpus")
  if (( gpus > 0 )); then
    opts="-Dspark.worker.resource.gpu.amount=$gpus"
    opts+=" -Dspark.worker.resource.gpu.discoveryScript=$SPARK_STATE/gpu-discovery.sh"
  fi
  mkdir -p "$SPARK_STATE/work-$h"
  WORKER_OPTS=$opts spark_daemon "$h" "worker-$h" org.apache.spark.deploy.worker.Worker \
    --host "$addr" --cores "$(cat "$SPARK_STATE/cores")" --memory 2g \
    --work-dir "$SPARK_STATE/work-$h" --webui-port 0 \
    "spark://$(address_of hvd-h1):$SPARK_MASTER_PORT"
  local i
  for ((i = 0; i < 600; i++)); do  # at most 60 s
    if (( $(grep -c "Registering worker $addr:" "$master_log" 2>/dev/null || true) > before )); then
      return 0
    fi
    kill -0 "$(cat "$SPARK_STATE/worker-$h.pid")" 2>/dev/null || break
    sleep 0.1
  done
  tail -20 "$SPARK_STATE/worker-$h.log" >&2
  echo "testbed: spark: the worker on $h did not register with the master" >&2
  return 1
}

write_gpu_discovery() {  # write_gpu_discovery G: the fake discovery script
  cat > "$SPARK_STATE/gpu-discovery.sh" <<EOF
#!/bin/sh
# Fake GPUs for tests: $1 per host, addresses 10N, 10N+1, ... on hvd-hN (distinct per host).
n=\$(hostname | sed 's/^hvd-h//')
printf '{"name": "gpu", "addresses": ['
i=0
while [ \$i -lt $1 ]; do
  [ \$i -gt 0 ] && printf ', '
  printf '"%d"' \$((n * 10 + i))
  i=\$((i + 1))
done
printf ']}\n'
EOF
  chmod +x "$SPARK_STATE/gpu-discovery.sh"
}

cmd_spark() {
  local sub=${1:-}
  shift || true
  SPARK_PY=$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python
  case "$sub" in
    up)
      local cores=2 gpus=0
      while [[ $# -gt 0 ]]; do
        case "$1" in
          --cores) cores=${2:-}; shift 2 ;;
          --gpus) gpus=${2:-}; shift 2 ;;
          --python) SPARK_PY=${2:-}; shift 2 ;;
          *) die "spark up: unknown argument '$1'" ;;
        esac
      done
      [[ $cores =~ ^[0-9]+$ && $gpus =~ ^[0-9]+$ ]] || die "spark up: --cores and --gpus take numbers"
      local hosts
      hosts=$(host_names)
      [[ $(echo "$hosts" | wc -w) -ge 2 ]] || die "spark up: needs the test bed (testbed.sh up N, N >= 2)"
      command -v java >/dev/null || die "spark up: needs java (Java 17)"
      SPARK_HOME_DIR=$(spark_home)
      cmd_spark_down
      mkdir -p "$SPARK_STATE"
      echo "$cores" > "$SPARK_STATE/cores"
      echo "$gpus" > "$SPARK_STATE/gpus"
      echo "$SPARK_PY" > "$SPARK_STATE/python"
      write_gpu_discovery "$gpus"
      spark_daemon hvd-h1 master org.apache.spark.deploy.master.Master \
        --host "$(address_of hvd-h1)" --port "$SPARK_MASTER_PORT" --webui-port "$SPARK_MASTER_UI"
      if ! wait_for_log "$SPARK_STATE/master.log" "I have been elected leader" 60; then
        tail -20 "$SPARK_STATE/master.log" >&2
        cmd_spark_down
        die "spark: the master did not start"
      fi
      local h
      for h in $hosts; do
        [[ $h == hvd-h1 ]] && continue
        spark_worker "$h" || { cmd_spark_down; exit 1; }
      done
      echo "spark://$(address_of hvd-h1):$SPARK_MASTER_PORT"
      ;;
    worker)
      [[ -n ${1:-} && -f $SPARK_STATE/cores ]] || die "usage: testbed.sh spark worker HOST (after spark up)"
      SPARK_PY=$(cat "$SPARK_STATE/python")
      SPARK_HOME_DIR=$(spark_home)
      spark_worker "$1" || exit 1
      ;;
    down) cmd_spark_down ;;
    *) die "usage: testbed.sh spark up [--cores C] [--gpus G] [--python PY] | worker HOST | down" ;;
  esac
}

cmd_spark_down() {
  [[ -d $SPARK_STATE ]] || return 0
  local f
  for f in "$SPARK_STATE"/worker-*.pid "$SPARK_STATE"/master.pid; do
    [[ -f $f ]] && spark_stop "$(basename "$f" .pid)"
  done
  rm -rf "$SPARK_STATE"
}

# ---- Ray -------------------------------------------------------------------------------------
RAY_STATE=$STATE/ray
RAY_PORT=6379

ray_node() {  # HOST [head]: starts HOST's Ray node in its namespaces
  local h=$1 role=${2:-node} py token args
  py=$(cat "$RAY_STATE/python")
  token=$(cat "$RAY_STATE/token")
  if [[ $role == head ]]; then
    args=(--head --port "$RAY_PORT" --num-cpus 0 --include-dashboard false)
  else
    args=(--address "$(address_of hvd-h1):$RAY_PORT" --num-cpus "$(cat "$RAY_STATE/cpus")")
  fi
  # `ray start` returns once the node runs; its daemons stay in the host's namespaces. The
  # session files go under the test bed's state directory (removed by `down`).
  in_ns "$h" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$h" \
    env RAY_AUTH_MODE=token RAY_AUTH_TOKEN="$token" RAY_USAGE_STATS_ENABLED=0 \
    "$(dirname "$py")/ray" start "${args[@]}" --node-ip-address "$(address_of "$h")" \
    --temp-dir "$RAY_STATE/tmp" --disable-usage-stats > "$RAY_STATE/start-$h.log" 2>&1 || {
      tail -20 "$RAY_STATE/start-$h.log" >&2
      return 1
    }
}

ray_stop() {  # the Ray processes in the namespaces of HOST... (default: every test host)
  local h pid cmd hosts=("$@")
  [[ ${#hosts[@]} -gt 0 ]] || read -r -a hosts <<< "$(host_names | tr '\n' ' ')"
  for h in "${hosts[@]}"; do
    for pid in $(ip netns pids "$h" 2>/dev/null); do
      cmd=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null) || continue
      case "$cmd" in
        *raylet*|*gcs_server*|ray::*|*/ray/*|*/bin/ray\ *) kill -KILL "$pid" 2>/dev/null || true ;;
      esac
    done
  done
}

cmd_ray() {
  local sub=${1:-}
  shift || true
  case "$sub" in
    up)
      local cpus=2 py
      py=$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python
      while [[ $# -gt 0 ]]; do
        case "$1" in
          --cpus) cpus=${2:-}; shift 2 ;;
          --python) py=${2:-}; shift 2 ;;
          *) die "ray up: unknown argument '$1'" ;;
        esac
      done
      [[ $cpus =~ ^[0-9]+$ ]] || die "ray up: --cpus takes a number"
      [[ -x $(dirname "$py")/ray ]] || die "ray up: $(dirname "$py")/ray not found (pip install ray)"
      local hosts h
      hosts=$(host_names)
      [[ $(echo "$hosts" | wc -w) -ge 2 ]] || die "ray up: needs the test bed (testbed.sh up N, N >= 2)"
      cmd_ray_down
      mkdir -p "$RAY_STATE/tmp"
      chmod 700 "$RAY_STATE"
      echo "$cpus" > "$RAY_STATE/cpus"
      echo "$py" > "$RAY_STATE/python"
      (umask 077 && "$py" -c "import secrets; print(secrets.token_hex(32))" > "$RAY_STATE/token")
      ray_node hvd-h1 head || { cmd_ray_down; die "ray: the head did not start"; }
      for h in $hosts; do
        [[ $h == hvd-h1 ]] && continue
        ray_node "$h" || { cmd_ray_down; die "ray: $h's node did not start"; }
      done
      echo "$(address_of hvd-h1):$RAY_PORT $RAY_STATE/token"
      ;;
    node)
      [[ -n ${1:-} && -f $RAY_STATE/token ]] || die "usage: testbed.sh ray node HOST (after ray up)"
      ray_stop "$1"  # a node already there goes first
      ray_node "$1" || exit 1
      ;;
    down) cmd_ray_down ;;
    *) die "usage: testbed.sh ray up [--cpus C] [--python PY] | node HOST | down" ;;
  esac
}

cmd_ray_down() {
  [[ -d $RAY_STATE ]] || return 0
  ray_stop
  rm -rf "$RAY_STATE"
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  spark) shift; cmd_spark "$@" ;;
  ray) shift; cmd_ray "$@" ;;
  down) cmd_down ;;
  exec) shift; cmd_exec "$@" ;;
  link) shift; cmd_link "$@" ;;
  kill) shift; cmd_kill "$@" ;;
  rate) shift; cmd_rate "$@" ;;
  status) cmd_status ;;
  *) sed -n '2,45p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
