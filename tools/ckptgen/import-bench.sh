#!/bin/sh
# Times `voxpipe import` on a folder of originals (made by `voxpipe mkmodel --originals DIR`)
# and prints one JSON line: wall time, peak RSS (GNU time's maximum resident set size), the
# input (every checkpoint file, and the largest one), the output, peak RSS / largest input and
# / total input (the goal: ≤ 1.5 × the file size), and the input read rate in MB/s.
#
#   tools/ckptgen/import-bench.sh BIN FAMILY DIR DTYPE [OUT]
#
# DROP_CACHES=1 drops the page cache first (root only: sync; echo 3 > /proc/sys/vm/drop_caches),
# so the input comes from the disk ("cache": "cold"); otherwise it is likely in the page cache
# ("cache": "warm" — the originals were just written or read). The output file is removed.
set -eu
[ $# -ge 4 ] || { echo "usage: $0 BIN FAMILY DIR DTYPE [OUT]" >&2; exit 2; }
bin=$1 family=$2 dir=$3 dtype=$4 out=${5:-${TMPDIR:-/tmp}/voxpipe-import-bench-$$.gguf}
log=$(mktemp)
trap 'rm -f "$log" "$out"' EXIT
cache=warm
if [ "${DROP_CACHES:-0}" = 1 ]; then
	if sync && (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then cache=cold; else echo "$0: cannot drop caches (not root): warm cache" >&2; fi
fi
# The input: every file in DIR and its sub-folders (the checkpoints and the small side files).
total=$(find "$dir" -type f -printf '%s\n' | awk '{s+=$1} END {print s+0}')
largest=$(find "$dir" -type f -printf '%s\n' | sort -n | tail -1)
if [ -x /usr/bin/time ]; then
	/usr/bin/time -v "$bin" import --family "$family" --from "$dir" --dtype "$dtype" --out "$out" --quiet >"$log" 2>&1 || { tail -5 "$log" >&2; exit 1; }
else # no GNU time (Debian package time): wall time only
	echo "$0: no /usr/bin/time (apt-get install time): peak RSS not measured" >&2
	t0=$(date +%s.%N)
	"$bin" import --family "$family" --from "$dir" --dtype "$dtype" --out "$out" --quiet >"$log" 2>&1 || { tail -5 "$log" >&2; exit 1; }
	echo "Elapsed (wall clock) time (h:mm:ss or m:ss): $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')" >"$log"
fi
outb=$(stat -c %s "$out")
awk -v family="$family" -v dtype="$dtype" -v cache="$cache" -v total="$total" -v largest="$largest" -v outb="$outb" -v dir="$dir" '
/Elapsed \(wall clock\)/ { n = split($NF, p, ":"); wall = 0; for (i = 1; i <= n; i++) wall = wall * 60 + p[i] }
/Maximum resident set size/ { rss = $NF * 1024 }
/User time/ { user = $NF }
/System time/ { sys = $NF }
function num(v, f) { return rss > 0 ? sprintf(f, v) : "null" }
END {
	printf "{\"bench\":\"import\",\"family\":\"%s\",\"dtype\":\"%s\",\"from\":\"%s\",\"cache\":\"%s\",\"wall_s\":%.2f,\"user_s\":%.2f,\"sys_s\":%.2f,\"peak_rss_mb\":%s,\"input_mb\":%.1f,\"largest_input_mb\":%.1f,\"output_mb\":%.1f,\"rss_over_largest\":%s,\"rss_over_input\":%s,\"read_mb_s\":%.0f}\n",
		family, dtype, dir, cache, wall, user, sys, num(rss / 1e6, "%.1f"), total / 1e6, largest / 1e6, outb / 1e6, num(rss / largest, "%.3f"), num(rss / total, "%.3f"), total / 1e6 / (wall > 0 ? wall : 1)
}' "$log"
