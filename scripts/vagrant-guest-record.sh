#!/usr/bin/env bash
# Run inside the Vagrant VM by scripts/vagrant-test.sh (as root, from /vagrant
# after provisioning): kvcached --preset baseline with 4 workers, worker i
# pinned to CPU i (the Vagrantfile makes CPUs 0-1 socket 0 and 2-3 socket 1),
# under kvload, recorded by `kvprof record --collectors cachelines`.
#
#   vagrant-guest-record.sh OUT_DIR [SECONDS]
#
# Writes OUT_DIR/profile.json and the kvcached, kvload and record logs;
# stops kvcached and kvload on any exit.
set -euo pipefail

OUT=${1:?usage: vagrant-guest-record.sh OUT_DIR [SECONDS]}
SECONDS_RECORD=${2:-8}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PORT=11311
mkdir -p "$OUT"

SERVER=
LOAD=
finish() {
    [[ -n $LOAD ]] && kill "$LOAD" 2>/dev/null
    [[ -n $SERVER ]] && kill "$SERVER" 2>/dev/null
    wait 2>/dev/null || true
}
trap finish EXIT

server/build/kvcached -p "$PORT" -t 4 --preset baseline --probe-sample 4 \
    --cpu-affinity 0,1,2,3 >"$OUT/kvcached.log" 2>&1 &
SERVER=$!
for _ in $(seq 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
    kill -0 "$SERVER" 2>/dev/null || {
        cat "$OUT/kvcached.log" >&2
        exit 1
    }
    sleep 0.1
done
LOAD_ARGS=(--server "127.0.0.1:$PORT" --num-threads 2 --connections 2 --batch-size 16
    --set-pct 5 --num-items 1000 --min-size 32 --max-size 64)
server/build/kvload "${LOAD_ARGS[@]}" --populate-only >"$OUT/kvload-populate.log" 2>&1
echo "kvcached PID $SERVER (baseline, 4 workers on CPUs 0-3), 1000 keys stored"

# Under TCG a loaded guest slows BCC's compile several times over: start the
# load once record holds its perf event fds (its probes are attached).
.venv/bin/kvprof record -p "$SERVER" -d "$SECONDS_RECORD" -o "$OUT/profile.json" \
    --collectors cachelines >"$OUT/record.log" 2>&1 &
REC=$!
for _ in $(seq 600); do
    find "/proc/$REC/fd" -lname 'anon_inode:*perf_event*' 2>/dev/null | grep -q . && break
    kill -0 "$REC" 2>/dev/null || break
    sleep 0.5
done
server/build/kvload "${LOAD_ARGS[@]}" --no-population --duration 3600 >"$OUT/kvload.log" 2>&1 &
LOAD=$!
rc=0
wait "$REC" || rc=$?
cat "$OUT/record.log"
exit "$rc"
