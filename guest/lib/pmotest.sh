# Helpers for guest test scenarios (sourced by /init before each scenario).
#
# The contract with the host-side runner (tests/integration): every check prints exactly one
# line `PMOTEST <scenario>.<check> ok|fail <detail>` on the console. The detail is free text
# on one line; the host compares it when the check reports a value (e.g. a CPU count).

# pmo_check CHECK ok|fail DETAIL...
pmo_check() {
    _c=$1
    _r=$2
    shift 2
    # One line, whatever the detail holds.
    echo "PMOTEST ${PMOTEST_SCENARIO}.${_c} ${_r} $(printf '%s' "$*" | tr '\n\r' '  ')"
    # /init dumps the kernel log after the scenarios when anything failed.
    [ "$_r" = ok ] || : >/tmp/pmotest.failed
}

pmo_ok() {
    _c=$1
    shift
    pmo_check "$_c" ok "$@"
}

pmo_fail() {
    _c=$1
    shift
    pmo_check "$_c" fail "$@"
}

# pmo_param NAME DEFAULT: the value of `pmotest.NAME=` from the kernel command line.
# /init exports each as PMOTEST_<NAME> (upper case, '.' and '-' as '_').
pmo_param() {
    _n=$(echo "$1" | tr 'a-z.-' 'A-Z__')
    eval "_v=\${PMOTEST_${_n}-}"
    if [ -n "$_v" ]; then echo "$_v"; else echo "$2"; fi
}

# pmo_wait_dev PATH SECONDS: wait for a device node to appear (drivers probe asynchronously).
pmo_wait_dev() {
    _i=0
    while [ ! -e "$1" ]; do
        [ "$_i" -ge $(($2 * 10)) ] && return 1
        sleep 0.1
        _i=$((_i + 1))
    done
    return 0
}

# pmo_hex: stdin as one line of lowercase hex, for byte-exact comparisons.
pmo_hex() {
    od -An -v -tx1 | tr -d ' \n'
}
