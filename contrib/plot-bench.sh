#!/bin/sh
# Benchmark output as PNG plots (gnuplot): throughput and latency against
# block size, one line per transport, the baselines beside them.
#
# Usage: contrib/plot-bench.sh [-o DIR] [-p PREFIX] [-t TITLE] [-b LABEL=GBPS]... FILE...
#   FILE   ferry_bench --sweep --format=csv output (one line per transport and
#          operation in it: "ferry tcp write"; its memcpy_gbps column, when
#          measured (--memcpy-baseline), a dashed "memcpy" line), or a
#          Markdown table whose first column is the size, as
#          contrib/bench-osu-ferry-vs-mpi.sh prints (its "... MB/s" columns
#          are throughput, its "... us" columns latency; ratios are left out)
#   -o DIR     where the PNGs go (default .): PREFIXthroughput.png and
#              PREFIXlatency.png (the latter only when some FILE has latency)
#   -p PREFIX  file name prefix (default bench-)
#   -t TITLE   added to each plot's title (say the machine and its load)
#   -b LABEL=GBPS  a flat baseline on the throughput plot, as a size-less
#              measurement gives it (iperf3 over loopback: "iperf3 -P1=4.2")
# Needs gnuplot (Debian: gnuplot-nox).  Exit status 0 when the plots were
# written.
set -eu
out=. prefix=bench- title="" baselines=""
usage() { sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
while getopts "o:p:t:b:h" opt; do
    case $opt in
    o) out=$OPTARG ;;
    p) prefix=$OPTARG ;;
    t) title=$OPTARG ;;
    b) case ${OPTARG#*=} in
       "$OPTARG" | "" | *[!0-9.]* | *.*.*)
           echo "plot-bench.sh: -b wants LABEL=GBPS (a number), not $OPTARG" >&2; exit 2 ;;
       esac
       baselines="$baselines
$OPTARG" ;;
    *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || usage
command -v gnuplot >/dev/null || { echo "plot-bench.sh: gnuplot is not installed" >&2; exit 1; }
[ -d "$out" ] || { echo "plot-bench.sh: no folder $out" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Each input becomes series files in $tmp: NAME.tput ("size GB/s") and
# NAME.lat ("size median_us [p99_us]"), and a line in $tmp/series:
# "kind<TAB>file<TAB>label<TAB>style" (kind: tput, lat; style: main, base).
n=0
for file in "$@"; do
    [ -r "$file" ] || { echo "plot-bench.sh: cannot read $file" >&2; exit 1; }
    n=$((n + 1))
    if head -n 1 "$file" | grep -q '^block_size,'; then
        awk -F, -v dir="$tmp" -v n="$n" '
            NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
            $col["status"] != "ok" { next }
            {
                key = $col["transport"] " " $col["operation"]
                if (!(key in id)) {
                    id[key] = n "-" ++series
                    printf "tput\t%s/%s.tput\tferry %s\tmain\n", dir, id[key], key >> (dir "/series")
                    printf "lat\t%s/%s.lat\tferry %s\tmain\n", dir, id[key], key >> (dir "/series")
                }
                print $1, $col["gbps"] >> (dir "/" id[key] ".tput")
                print $1, $col["latency_median_us"], $col["latency_p99_us"] >> (dir "/" id[key] ".lat")
                if ($col["memcpy_gbps"] != "") {
                    if (!(key in mc))
                        printf "tput\t%s/%s.memcpy\tmemcpy (beside %s)\tbase\n", dir, id[key],
                               $col["transport"] >> (dir "/series")
                    mc[key] = 1
                    print $1, $col["memcpy_gbps"] >> (dir "/" id[key] ".memcpy")
                }
            }' "$file"
    elif grep -q '^| *size *|' "$file"; then
        awk -F'|' -v dir="$tmp" -v n="$n" '
            function trim(s) { gsub(/^ +| +$/, "", s); return s }
            /^\| *size *\|/ && !head {
                head = 1
                for (i = 3; i < NF; i++) {
                    h = trim($i)
                    if (h ~ / MB\/s$/) { kind[i] = "tput"; sub(/ MB\/s$/, "", h) }
                    else if (h ~ / us$/) { kind[i] = "lat"; sub(/ us$/, "", h) }
                    else continue
                    name[i] = dir "/" n "-" i "." kind[i]
                    printf "%s\t%s\t%s\tmain\n", kind[i], name[i], h >> (dir "/series")
                }
                next
            }
            head && trim($2) ~ /^[0-9]+$/ {
                for (i in kind) {
                    v = trim($i); sub(/x$/, "", v)
                    if (v == "" || v == "-") continue
                    print trim($2), (kind[i] == "tput" ? v / 1000 : v) >> name[i]
                }
            }' "$file"
    else
        echo "plot-bench.sh: $file is neither ferry_bench --sweep CSV nor a Markdown size table" >&2
        exit 1
    fi
done
[ -s "$tmp/series" ] || { echo "plot-bench.sh: no rows in $*" >&2; exit 1; }

# gnuplot's plot clause for one kind: each series a colour of its own, a
# baseline measured beside one dashed in its colour, p99 of a latency
# series dotted in its colour, flat baselines dash-dotted.
plot_clause() { # kind
    awk -F'\t' -v kind="$1" -v flat="$baselines" '
        $1 != kind { next }
        {
            sep = c + b > 0 ? ", \\\n     " : ""
            if ($4 == "base")
                b++ # in the colour of the series it was measured beside
            else
                c++
            if ($4 == "base")
                printf "%s\"%s\" using 1:2 with linespoints dt 2 pt 6 lc %d title \"%s\"", sep, $2, c, $3
            else
                printf "%s\"%s\" using 1:2 with linespoints pt 7 lc %d title \"%s%s\"", sep, $2, c,
                       $3, kind == "lat" ? " median" : ""
            if (kind == "lat" && $4 == "main") {
                if ((getline line < $2) > 0 && split(line, f, " ") >= 3)
                    printf ", \\\n     \"%s\" using 1:3 with lines dt 3 lc %d title \"%s p99\"",
                           $2, c, $3
                close($2)
            }
        }
        END {
            if (kind != "tput") exit
            m = split(flat, items, "\n")
            for (i = 1; i <= m; i++) {
                if (items[i] == "") continue
                eq = index(items[i], "=")
                printf ", \\\n     %s with lines dt 4 lw 2 lc %d title \"%s\"", substr(items[i], eq + 1),
                       ++c, substr(items[i], 1, eq - 1)
            }
        }' "$tmp/series"
}

suffix=""
[ -z "$title" ] || suffix=" ($title)"
common='set terminal pngcairo size 900,540 font "sans,10"
set logscale xy 2
set logscale y 10
set grid xtics ytics mxtics mytics lc rgb "#dddddd"
set key outside right top
set xlabel "block size (bytes)"
set autoscale xfix
set xtics ("1" 1, "4" 4, "16" 16, "64" 64, "256" 256, "1K" 2**10, "4K" 2**12, "16K" 2**14, \
           "64K" 2**16, "256K" 2**18, "1M" 2**20, "4M" 2**22, "16M" 2**24, "64M" 2**26, \
           "256M" 2**28, "1G" 2**30)'
{
    echo "$common"
    echo "set output \"$out/${prefix}throughput.png\""
    echo "set title \"Throughput against block size$suffix\""
    echo "set ylabel \"GB/s (10^9 bytes/s)\""
    echo "plot $(plot_clause tput)"
} > "$tmp/throughput.gp"
gnuplot "$tmp/throughput.gp"
echo "$out/${prefix}throughput.png"
if grep -q '^lat' "$tmp/series"; then
    {
        echo "$common"
        echo "set output \"$out/${prefix}latency.png\""
        echo "set title \"Latency against block size$suffix\""
        echo "set ylabel \"microseconds\""
        echo "plot $(plot_clause lat)"
    } > "$tmp/latency.gp"
    gnuplot "$tmp/latency.gp"
    echo "$out/${prefix}latency.png"
fi
