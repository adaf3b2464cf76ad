#!/usr/bin/env bash
# Commit the records of running studies as they arrive: every INTERVAL seconds (default 600), for
# each NAME:RUNS argument, `git add` + `git commit` of docs/results/NAME/records alone (nothing else
# staged is committed; a record being written, *.tmp, waits for the next pass) with the message
# "study NAME: N of RUNS runs", when it has changes. Stops when every study has all its records, or,
# with WATCH_PID set, once that process (the sweep) has ended and a last pass has committed what it left.
#
#   WATCH_PID=<run_studies.sh pid> nohup setsid nice -n 19 scripts/commit_records.sh \
#       standin-dpt-glue:45 standin-inducer-nlu:54 standin-sidpg-diagnosis:33 standin-inducer-diagnosis:45 standin-dpt-diagnosis:15 > sweeps/commit_records.log 2>&1 &
set -u
cd "$(dirname "$0")/.."
interval=${INTERVAL:-600}
[ $# -gt 0 ] || { echo "usage: commit_records.sh NAME:RUNS ..." >&2; exit 2; }
while true; do
    alive=1
    [ -n "${WATCH_PID:-}" ] && ! kill -0 "$WATCH_PID" 2>/dev/null && alive=0
    complete=1
    for arg in "$@"; do
        name=${arg%%:*} total=${arg##*:} dir=docs/results/${arg%%:*}/records
        n=0
        [ -d "$dir" ] && n=$(find "$dir" -name '*.json' | wc -l)
        [ "$n" -lt "$total" ] && complete=0
        if [ -d "$dir" ] && [ -n "$(git status --porcelain --untracked-files=all -- "$dir" | grep -v '\.tmp$')" ]; then
            # a busy index (another commit in this checkout) is retried at the next pass
            find "$dir" -name '*.json' -print0 | xargs -0 git add -- &&
                git commit -q -m "study $name: $n of $total runs" -- "$dir" &&
                echo "$(date -u +%FT%TZ) committed study $name: $n of $total runs"
        fi
    done
    [ "$complete" -eq 1 ] && { echo "$(date -u +%FT%TZ) all studies complete"; exit 0; }
    [ "$alive" -eq 0 ] && { echo "$(date -u +%FT%TZ) WATCH_PID $WATCH_PID ended"; exit 0; }
    sleep "$interval"
done
