# shellcheck shell=bash
# What scripts/vagrant-box.sh and scripts/vagrant-test.sh share: messages,
# timed steps, and the name and folder of the local box. Sourced, not run.

# The box `make vagrant-box` adds, and `make vagrant-test` boots: "kvprof-local/"
# says that it was built on this machine and is in no box catalogue.
KVPROF_LOCAL_BOX=${KVPROF_LOCAL_BOX:-kvprof-local/debian12}
# shellcheck disable=SC2034  # used by the scripts that source this
VAGRANT_WORK=${KVPROF_VAGRANT_DIR:-$REPO/build/vagrant}
# No version check against HashiCorp's servers.
export VAGRANT_CHECKPOINT_DISABLE=1

# vagrant for commands about no machine (box, plugin, global-status), run from
# / so that it makes no .vagrant/ in the checkout (it does in a folder with a
# Vagrantfile).
vagrant_global() { (cd / && vagrant "$@"); }

log() { printf '%s: %s\n' "$ME" "$*"; }
die() {
    printf '%s: error: %s\n' "$ME" "$*" >&2
    exit 1
}

seconds_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}'; }

# step NAME COMMAND...: run one step, print how long it took, and on failure
# say which step failed (its output is above, or in the log it names).
TIMES=()
step() {
    local name=$1 t0=$EPOCHREALTIME rc=0
    shift
    log "step $name..."
    "$@" || rc=$?
    local took
    took=$(seconds_since "$t0")
    TIMES+=("$name ${took}s")
    if [[ $rc -ne 0 ]]; then
        die "step $name FAILED (exit $rc) after $took s"
    fi
    log "step $name took $took s"
}

times_line() {
    local IFS=,
    echo "${TIMES[*]}" | sed 's/,/, /g'
}
