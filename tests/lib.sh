# Shared by the shell tests (source it): PASS/FAIL lines and their counts.
#   ok NAME / bad NAME          record a result
#   check NAME COMMAND...       passes when the command succeeds
#   expect NAME TEXT COMMAND... passes when the command fails with TEXT in its output
#   summary                     "N passed, M failed"; its status is the test's
pass=0
fail=0

ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }

check() {
    local name=$1
    shift
    if "$@"; then ok "$name"; else bad "$name"; fi
}

expect() {
    local name=$1 want=$2
    shift 2
    local out rc
    out=$("$@" 2>&1)
    rc=$?
    if [ $rc -ne 0 ] && grep -qF -- "$want" <<< "$out"; then
        ok "$name"
    else
        bad "$name: exit $rc, wanted a message with '$want', got:"
        tail -5 <<< "$out" | sed 's/^/    /'
    fi
}

summary() {
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
