#!/bin/sh
# Run a command under a cgroup v1 memory cap (the page cache it causes is
# charged too): sh tests/cgroup_run.sh CAP_BYTES USAGE_FILE CMD [ARG...]
# The command's exit status is returned; its peak usage of the cgroup
# (memory.max_usage_in_bytes) and its failcnt go to USAGE_FILE as
# "max_usage_bytes failcnt". Exit 77 (and nothing run) when no memory
# cgroup can be made here (not root, cgroup v2 only, read-only).
set -u
cap=$1 usage=$2
shift 2
root=/sys/fs/cgroup/memory
[ -w "$root" ] && [ -f "$root/memory.limit_in_bytes" ] || exit 77
cg="$root/pi2-$$-$(date +%s%N)"
mkdir "$cg" 2>/dev/null || exit 77
cleanup() {
    [ -d "$cg" ] || return 0
    # move anything left back to the root, then remove the group
    for p in $(cat "$cg/cgroup.procs" 2>/dev/null); do echo "$p" >"$root/cgroup.procs" 2>/dev/null; done
    rmdir "$cg" 2>/dev/null || true
}
trap cleanup EXIT INT TERM
echo "$cap" >"$cg/memory.limit_in_bytes" || exit 77
[ -f "$cg/memory.memsw.limit_in_bytes" ] && echo "$cap" >"$cg/memory.memsw.limit_in_bytes" 2>/dev/null
echo 0 >"$cg/memory.swappiness" 2>/dev/null
sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$cg" "$@"
rc=$?
echo "$(cat "$cg/memory.max_usage_in_bytes") $(cat "$cg/memory.failcnt")" >"$usage"
exit $rc
