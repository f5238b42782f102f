#!/usr/bin/env bash
# with_memory_limit.sh MIB COMMAND...   runs COMMAND in a memory cgroup of its own limited to MIB
# MiB (the kernel's cgroup v1 memory controller, or cgroup v2's memory.max: the kernel counts
# every page the process and its threads touch, and its OOM killer ends the process past the
# limit, exit status 137). One cgroup per call: under mpirun, one per rank. Needs root; the
# cgroup is removed when COMMAND ends, also when it fails or is killed.
set -uo pipefail
[[ $# -ge 2 ]] || { echo "usage: with_memory_limit.sh MIB COMMAND..." >&2; exit 2; }
mib=$1; shift
name="hvd-limit-$$"
if [[ -d /sys/fs/cgroup/memory ]]; then            # cgroup v1
  cg=/sys/fs/cgroup/memory/$name
  mkdir "$cg" || exit 1
  echo $((mib * 1024 * 1024)) > "$cg/memory.limit_in_bytes"
  if [[ -f $cg/memory.memsw.limit_in_bytes ]]; then   # no escape into swap
    echo $((mib * 1024 * 1024)) > "$cg/memory.memsw.limit_in_bytes"
  fi
  procs=$cg/cgroup.procs
elif [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then  # cgroup v2
  cg=/sys/fs/cgroup/$name
  mkdir "$cg" || exit 1
  echo $((mib * 1024 * 1024)) > "$cg/memory.max"
  echo 0 > "$cg/memory.swap.max" 2>/dev/null || true
  procs=$cg/cgroup.procs
else
  echo "with_memory_limit.sh: no memory cgroup on this machine" >&2
  exit 1
fi
# The cgroup goes once its last process has exited, removed by a watcher in a session of its
# own: mpirun may SIGKILL this script when another rank fails, and the watcher outlives it.
setsid bash -c 'cg=$1
  sleep 1
  while [[ -n $(cat "$cg/cgroup.procs" 2>/dev/null) ]]; do sleep 0.2; done
  for _ in 1 2 3 4 5 6 7 8 9 10; do rmdir "$cg" 2>/dev/null && exit 0; sleep 0.1; done' \
  _ "$cg" < /dev/null > /dev/null 2>&1 &
# The child moves itself into the cgroup before it execs COMMAND: everything it allocates counts.
bash -c 'echo $$ > "$1"; shift; exec "$@"' _ "$procs" "$@" &
child=$!
# Stopped (mpirun ends the other ranks of a failed job): end COMMAND at once.
trap 'kill -KILL $child 2>/dev/null; wait $child 2>/dev/null; exit 143' TERM INT HUP
wait $child
