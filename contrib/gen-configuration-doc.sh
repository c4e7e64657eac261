#!/bin/sh
# Print the settings tables for doc/configuration.md from `ferry_info -c`.
# Usage: contrib/gen-configuration-doc.sh BUILD_DIR
set -eu
build=${1:-.}
env -i PATH="$PATH" FERRY_MODULE_DIR="$build/modules/.libs" "$build/ferry_info" -c | awk '
/^# ---- / { sub(/^# ---- /, ""); sub(/ ----$/, ""); title = $0; next }
/^# / { doc = substr($0, 3); next }
/^FERRY_/ {
    if (title != "") {
        if (printed) print ""
        print "### " title; print ""
        print "| variable | default | meaning |"; print "|---|---|---|"
        title = ""; printed = 1
    }
    name = substr($0, 1, index($0, "=") - 1); value = substr($0, index($0, "=") + 1)
    if (index(value, "   # default: ")) value = substr(value, index(value, "   # default: ") + 14)
    printf "| `%s` | `%s` | %s |\n", name, value, doc
}'
