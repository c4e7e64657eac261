#!/bin/bash
# Mutation check of the test suite (not run in CI: it rebuilds once per
# mutant).  Each mutant of contrib/mutants.txt is one small deliberate bug:
# it is applied, alone, to a scratch copy of this tree, the copy is rebuilt
# and the mutant's tests run.  A mutant the tests fail on is CAUGHT; one
# they pass is SURVIVED, and means a check of the code no test holds to.
#
#   contrib/mutants.sh [options] [NAME...]     (NAMEs: only those mutants)
#     -l FILE     the list (default: contrib/mutants.txt next to this script)
#     -f          run the whole suite for every mutant, not its tests
#     -c ARGS     extra configure arguments (e.g. -c --enable-sanitizers)
#     -t SECONDS  limit per mutant's test run (default 900)
#     -j N        make -j (default 2)
#     -k          keep the scratch copy (its path is printed)
#     -n          no baseline (the unmutated suite is not run first)
#
# The list: blocks separated by blank lines, "key: value" lines, # comments.
#   name:  a short id               why:   what bug it is, one line
#   file:  path in the tree         tests: test programs to run (else all)
#   from:  exact text, found once   to:    its replacement
#   filter: optional CRITERION_TEST_PATTERN for those programs
# A line "| text" after from: or to: continues its value on a new line
# (the text after "| ", indentation kept).  A from: found other than once
# is STALE (the code changed under it: update the mutant), a mutant that
# does not build is BROKEN; both count as failures of this script.
#
# Exit status: 0 when every mutant was caught.
set -u

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
list="$here/mutants.txt"
full=0 keep=0 baseline=1 limit=900 jobs=2 configure_args=()
while getopts "l:fc:t:j:kn" opt; do
    case $opt in
    l) list=$(cd "$(dirname "$OPTARG")" && pwd)/$(basename "$OPTARG") ;;
    f) full=1 ;;
    c) read -ra words <<<"$OPTARG" && configure_args+=("${words[@]}") ;;
    t) limit=$OPTARG ;;
    j) jobs=$OPTARG ;;
    k) keep=1 ;;
    n) baseline=0 ;;
    *) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
wanted=" $* "

for tool in perl git autoreconf make timeout; do
    command -v $tool >/dev/null || { echo "mutants.sh: $tool is not installed" >&2; exit 2; }
done
[ -r "$list" ] || { echo "mutants.sh: no list $list" >&2; exit 2; }

# ---- the list, parsed into arrays ----
names=() files=() froms=() tos=() testss=() filters=() whys=()
flush() {
    [ -n "$name" ] || return 0
    if [ -z "$file" ] || [ -z "$from" ] || [ -z "$why" ] || [ "$has_to" = 0 ]; then
        echo "mutants.sh: mutant \"$name\" lacks file, from, to or why" >&2
        exit 2
    fi
    names+=("$name") files+=("$file") froms+=("$from") tos+=("$to")
    testss+=("$tests") filters+=("$filter") whys+=("$why")
}
reset_block() { name='' file='' from='' to='' tests='' filter='' why='' key='' has_to=0; }
reset_block
while IFS= read -r line || [ -n "$line" ]; do
    case $line in
    '#'*) continue ;;
    '') flush; reset_block; continue ;;
    esac
    if [[ $line =~ ^[[:space:]]*\|\ ?(.*)$ ]]; then
        case $key in
        from) from+=$'\n'"${BASH_REMATCH[1]}" ;;
        to) to+=$'\n'"${BASH_REMATCH[1]}" ;;
        *) echo "mutants.sh: \"| \" line after $key: in mutant $name" >&2; exit 2 ;;
        esac
        continue
    fi
    key=${line%%:*}
    value=${line#*:}
    value=${value# }
    case $key in
    name) name=$value ;;
    file) file=$value ;;
    from) from=$value ;;
    to) to=$value; has_to=1 ;;
    tests) tests=$value ;;
    filter) filter=$value ;;
    why) why=$value ;;
    *) echo "mutants.sh: unknown key \"$key\" in mutant $name" >&2; exit 2 ;;
    esac
done <"$list"
flush

# ---- the scratch copy: tracked and untracked (not ignored) files ----
scratch=$(mktemp -d "${TMPDIR:-/tmp}/ferry-mutants.XXXXXX")
cleanup() {
    if [ "$keep" = 1 ]; then echo "scratch copy kept: $scratch"; else rm -rf "$scratch"; fi
}
trap cleanup EXIT
(cd "$top" && git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
    tar --null -T - -cf -) |
    (cd "$scratch" && tar -xf -) || { echo "mutants.sh: copying the tree failed" >&2; exit 2; }
mkdir -p "$scratch/logs"
echo "scratch copy: $scratch (logs in $scratch/logs; -k keeps them)"

build() { # $1: log file.  Builds the library, tools and test programs.
    make -C "$scratch/build" -j"$jobs" check TESTS= >>"$1" 2>&1
}
# timeout runs the tests in a process group of its own: stopping this
# script stops them too.
running=
trap '[ -n "$running" ] && kill -TERM -- "-$running" 2>/dev/null; exit 130' INT TERM
run_tests() { # $1: log, $2: test programs (empty: all), $3: filter.  124: timed out
    local make_args=(-C "$scratch/build" -j"$jobs" check) rc
    [ -n "$2" ] && make_args+=(TESTS="$2")
    if [ -n "$3" ]; then
        CRITERION_TEST_PATTERN="$3" timeout "$limit" make "${make_args[@]}" >>"$1" 2>&1 &
    else
        timeout "$limit" make "${make_args[@]}" >>"$1" 2>&1 &
    fi
    running=$!
    wait "$running"
    rc=$?
    running=
    return $rc
}
# Apply from -> to in file $1 (must occur exactly once); prints the count
# when it does not.
substitute() {
    MUT_FROM="$2" MUT_TO="$3" perl -e '
        local $/; open(my $in, "<", $ARGV[0]) or die "$ARGV[0]: $!\n"; my $s = <$in>; close $in;
        my ($from, $to) = ($ENV{MUT_FROM}, $ENV{MUT_TO});
        my $n = () = $s =~ /\Q$from\E/g;
        if ($n != 1) { print "$n\n"; exit 3 }
        substr($s, index($s, $from), length $from) = $to;
        open(my $out, ">", $ARGV[0]) or die "$ARGV[0]: $!\n"; print $out $s; close $out;' "$1"
}

echo "configuring and building the scratch copy..."
if ! (cd "$scratch" && ./autogen.sh >"$scratch/logs/build.log" 2>&1 && mkdir -p build &&
    cd build && ../configure --quiet "${configure_args[@]}" >>"$scratch/logs/build.log" 2>&1) ||
    ! build "$scratch/logs/build.log"; then
    echo "mutants.sh: the unmutated tree does not build (logs/build.log):" >&2
    tail -20 "$scratch/logs/build.log" >&2
    exit 2
fi

selected=()
for i in "${!names[@]}"; do
    [ "$wanted" = "  " ] || [[ $wanted == *" ${names[$i]} "* ]] && selected+=("$i")
done
[ ${#selected[@]} -gt 0 ] || { echo "mutants.sh: no mutant selected" >&2; exit 2; }

if [ "$baseline" = 1 ]; then
    programs=
    if [ "$full" = 0 ]; then
        for i in "${selected[@]}"; do
            [ -n "${testss[$i]}" ] || { programs=; break; }
            for t in ${testss[$i]}; do [[ " $programs " == *" $t "* ]] || programs+=" $t"; done
        done
    fi
    programs=${programs# }
    echo "baseline: the unmutated suite (${programs:-all tests})..."
    if ! run_tests "$scratch/logs/baseline.log" "$programs" ""; then
        echo "mutants.sh: the unmutated suite fails (logs/baseline.log); nothing to learn" >&2
        grep -E '^(FAIL|ERROR):' "$scratch/logs/baseline.log" >&2
        exit 2
    fi
fi

caught=0 survived=0 stale=0 broken=0 survivors=
for i in "${selected[@]}"; do
    name=${names[$i]} file=${files[$i]}
    log="$scratch/logs/$name.log"
    target="$scratch/$file"
    start=$(date +%s) note=
    if [ ! -f "$target" ]; then
        verdict=STALE
        echo "no such file $file" >"$log"
    else
        cp -p "$target" "$scratch/logs/original"
        count=$(substitute "$target" "${froms[$i]}" "${tos[$i]}")
        if [ -n "$count" ]; then
            verdict=STALE
            echo "the from: text occurs $count times in $file (must be once)" >"$log"
        elif ! build "$log"; then
            verdict=BROKEN
        else
            tests=${testss[$i]} filter=${filters[$i]}
            [ "$full" = 1 ] && tests='' filter=''
            run_tests "$log" "$tests" "$filter"
            case $? in
            0) verdict=SURVIVED ;;
            124) verdict=CAUGHT note=" (by the time limit: it hangs)" ;;
            *) verdict=CAUGHT ;;
            esac
        fi
        # Back as it was, and newer than what the mutant built: make rebuilds it.
        cp "$scratch/logs/original" "$target"
        touch "$target"
    fi
    case $verdict in
    CAUGHT) caught=$((caught + 1)) ;;
    SURVIVED) survived=$((survived + 1)); survivors+=" $name" ;;
    STALE) stale=$((stale + 1)); survivors+=" $name(stale)" ;;
    BROKEN) broken=$((broken + 1)); survivors+=" $name(broken)" ;;
    esac
    printf '%-8s %-36s %4ss  %s%s\n' "$verdict" "$name" $(($(date +%s) - start)) "${whys[$i]}" \
        "$note"
done
build "$scratch/logs/build.log" >/dev/null 2>&1 # leave the copy unmutated for -k

total=${#selected[@]}
echo "mutants: $total, caught $caught, survived $survived, stale $stale, broken $broken"
[ -z "$survivors" ] || echo "not caught:$survivors"
[ "$caught" = "$total" ]
