#!/usr/bin/env bash
# Host test of the PMO mode on the file test backend (make host-test O=DIR runs it):
#   1. test_pmo_api: the API's promises (syncs per commit, refused calls, MDB_MAP_FULL, ...).
#   2. LMDB's mtest .. mtest6, unmodified, each in a fresh directory DIR/run/<mtest>/testdb:
#      exit 0; the digest the shim printed at close equals what lmdb_check finds in a new
#      process, and what lmdb_check_plain (unpatched LMDB's file path) finds in the data
#      file; mdb_stat reads it; lmdb_check -w 3 commits 3 transactions with exactly 3 syncs,
#      and a fresh reader then sees them (persisted across close/reopen); a writer killed
#      inside its commit's sync (LMDB_PMO_CRASH_AT_SYNC) exits 75 with the commit written
#      into the (non-atomic) file.
# Prints PASS/FAIL per step and "N passed, N failed"; exits 1 on any failure.
set -uo pipefail

O=$(cd "${1:?usage: run_mtests.sh BUILD_DIR}" && pwd)
run="$O/run"
rm -rf "$run"
mkdir -p "$run"
passed=0
failed=0

pass() {
    echo "PASS $*"
    passed=$((passed + 1))
}
fail() {
    echo "FAIL $*"
    failed=$((failed + 1))
}
# digest FILE PREFIX: "dbs=.. entries=.. fnv=.." from the line starting with PREFIX.
digest() { sed -n "s/^$2 \(dbs=[0-9]* entries=[0-9]* fnv=[0-9a-f]*\)\$/\1/p" "$1" | tail -n 1; }
# entries DIGEST: its entry count, -1 if it has none.
entries() {
    _e=$(echo "$1" | sed -n 's/.*entries=\([0-9]*\).*/\1/p')
    echo "${_e:--1}"
}

mkdir -p "$run/api"
if "$O/test_pmo_api" "$run/api" >"$run/api.log" 2>&1; then
    pass "test_pmo_api: $(tail -n 1 "$run/api.log")"
else
    fail "test_pmo_api: $(grep -E '^FAIL|passed' "$run/api.log" | tr '\n' ' ')"
fi

for m in mtest mtest2 mtest3 mtest4 mtest5 mtest6; do
    d="$run/$m"
    mkdir -p "$d/testdb"
    cd "$d" || exit 1
    if ! "$O/lmdb_$m" >out.log 2>err.log; then
        fail "$m: exit $? ($(tail -n 3 err.log | tr '\n' ' '))"
        continue
    fi
    if ! grep -q "^mtest_pmo: open ./testdb/data.mdb backend=file" err.log; then
        fail "$m: did not run on the PMO backend: $(head -n 2 err.log | tr '\n' ' ')"
        continue
    fi
    want=$(digest err.log "mtest_pmo: close LMDBDIGEST")
    "$O/lmdb_check" testdb >check.log 2>>err.log
    got=$(digest check.log LMDBCHECK)
    "$O/lmdb_check_plain" testdb >plain.log 2>>err.log
    plain=$(digest plain.log LMDBCHECK)
    if [[ -z $want || $got != "$want" || $plain != "$want" ]]; then
        fail "$m: digest at close '$want', reopened '$got', plain LMDB '$plain'"
        continue
    fi
    if ! "$O/lmdb_mdb_stat" -a testdb >stat.log 2>>err.log || ! grep -q '^Status of Main DB' stat.log; then
        fail "$m: mdb_stat: $(tail -n 2 err.log | tr '\n' ' ')"
        continue
    fi
    "$O/lmdb_check" -w 3 testdb >write.log 2>>err.log
    wrote=$(digest write.log LMDBCHECK)
    "$O/lmdb_check" testdb >again.log 2>>err.log
    again=$(digest again.log LMDBCHECK)
    if ! grep -qx 'LMDBCHECK-PMO commits=3 syncs=3' write.log; then
        fail "$m: 3 commits: $(cat write.log err.log | tail -n 4 | tr '\n' ' ')"
    elif [[ $(entries "$wrote") != $(($(entries "$want") + 3)) || $again != "$wrote" ]]; then
        fail "$m: after 3 commits '$wrote', reopened '$again' (before: '$want')"
    else
        pass "$m: $want; +3 commits, 3 syncs, reopened: $again"
    fi
    # The crash hook fires inside the commit's sync, after its meta page is written. This
    # backend is NOT atomic (its file already has the pages), so the commit survives here;
    # on libpmo (guest/scenarios/lmdb_mtest) the same crash must leave the digest before it.
    LMDB_PMO_CRASH_AT_SYNC=1 "$O/lmdb_check" -w 1 testdb >crash.log 2>>err.log
    rc=$?
    "$O/lmdb_check" testdb >after.log 2>>err.log
    after=$(digest after.log LMDBCHECK)
    if [[ $rc -eq 75 && $(entries "$after") == $(($(entries "$again") + 1)) ]]; then
        pass "$m: killed inside its commit's sync (exit 75): file backend kept it ($after)"
    else
        fail "$m: crash hook: exit $rc (want 75), before '$again', after '$after'"
    fi
done

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
