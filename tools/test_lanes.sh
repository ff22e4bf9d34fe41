#!/usr/bin/env bash
# `make test`'s runner: the suites of each lane one after another, the lanes at once.
#
# usage: tools/test_lanes.sh LOGDIR 'suite suite …' 'suite suite …' …
#   RUN_SUITE (environment): the command that runs one suite, given its name (a make invocation).
#
# Why lanes: on a 2-core machine one suite keeps about one core busy (engine and daemon starts are
# mostly one Python process importing torch; the cluster's suites wait on the control plane), so
# two lanes finish in little more than the longer one's time.
#
# The first lane's output streams here; every other lane's goes to LOGDIR/lane<K>.log and is printed
# once all lanes are done, so no two suites' lines interleave. Every suite runs whatever an earlier
# one did; a line per suite (verdict and minutes) closes the output, and the exit status is non-zero
# if any suite failed.
set -uo pipefail

logs=$1
shift
: "${RUN_SUITE:?RUN_SUITE must name the command that runs one suite}"
mkdir -p "$logs"
rm -f "$logs"/lane*.log "$logs"/lane*.summary

run_lane() {
    local lane=$1 suite verdict started
    shift
    for suite in "$@"; do
        started=$SECONDS
        # RUN_SUITE is a command line: split into words on purpose.
        # shellcheck disable=SC2086
        if $RUN_SUITE "$suite"; then verdict=passed; else verdict=FAILED; fi
        echo "make test: $suite $verdict ($((SECONDS - started)) s, lane $lane)" >>"$logs/lane$lane.summary"
    done
}

pids=()
lanes=0
for suites in "$@"; do
    lanes=$((lanes + 1))
    # A lane's suites are a space-separated list: split into words on purpose.
    # shellcheck disable=SC2086
    if [ "$lanes" -eq 1 ]; then
        run_lane "$lanes" $suites &
    else
        run_lane "$lanes" $suites >"$logs/lane$lanes.log" 2>&1 &
    fi
    pids+=($!)
done
wait "${pids[@]}"

for ((lane = 2; lane <= lanes; lane++)); do
    echo "===== lane $lane of make test ($logs/lane$lane.log)"
    cat "$logs/lane$lane.log"
done
cat "$logs"/lane*.summary
! grep -q FAILED "$logs"/lane*.summary
