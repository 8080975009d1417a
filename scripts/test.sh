#!/usr/bin/env bash
# The test command for a fresh machine. Run from anywhere:
#   bash scripts/test.sh [pytest args...]
# Runs the suite on the version matrix, one leg after the other, each in its
# own venv with the project installed with its test extras:
#   dj52  .venv      python3 (3.11+)  Django 5.2 + the django-tasks backport
#   dj6   .venv-dj6  python3.12       the newest Django 6.x, with the [fast] extra
#                                     (hiredis: the scripts' own write, Scripts._written;
#                                     dj52 runs without it: redis-py's pipeline)
#   valkey .venv      python3          as dj52, on Valkey 8 instead of redis-server
#                                     (ECHOMQ_REDIS_SERVER, from scripts/valkey.sh); not
#                                     in the default legs: .ci/run runs it after them
# LEGS="dj52" (or "dj6") runs one leg. python3.12 is found on PATH or in
# pyenv; without it the dj6 leg is skipped with a message (an error under CI).
# Makes sure redis-server is on PATH (the suite starts its own private
# servers on free loopback ports; it never uses an existing Redis).
#
# A leg whose run has failures runs its failed tests once more, alone
# (pytest --last-failed); the leg fails when any of them fails again. Every
# failure of either run is listed at the end, and again in the file
# $TEST_SUMMARY when that is set (.ci/run prints it last), so a test that
# passed only on its second run is still named. A run that dies (a signal,
# such as a segfault in a C extension) is named by its "Fatal Python error"
# line (under -v that line starts with the test's id) and run once more
# whole. Exits non-zero when any leg fails.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

find_python312() {
    # A candidate counts only if it runs: pyenv's shim is on PATH even when
    # 3.12 is not the selected version, and then it fails.
    # pyenv's root is asked of pyenv, then taken from PYENV_ROOT, $HOME and
    # root's home (a CI shell may have neither pyenv on PATH nor HOME).
    local root cand
    root="$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-${HOME:-/root}/.pyenv}")"
    for cand in "$(command -v python3.12 2>/dev/null)" \
        $(ls -d "$root"/versions/3.12*/bin/python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 \
            /usr/local/bin/python3.12 /usr/bin/python3.12 2>/dev/null | sort -rV); do
        if [ -n "$cand" ] && "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
            echo "$cand"
            return 0
        fi
    done
    return 1
}

SUMMARY="${TEST_SUMMARY:-$(mktemp)}"
: >"$SUMMARY"

# run_pytest LEG PYTHON [pytest args...]: the leg's run, then its failed
# tests once more alone (or, when the run died, the whole leg once more);
# appends each run's result line and failures to $SUMMARY.
run_pytest() {
    local leg="$1" py="$2" log rc crash
    shift 2
    log="$(mktemp)"
    # pytest_run LABEL [extra args...]: one run, its result in $rc and $SUMMARY
    pytest_run() {
        local label="$1"
        shift
        "$py" -m pytest "${args[@]}" "$@" 2>&1 | tee "$log"
        rc="${PIPESTATUS[0]}"
        {
            echo "== $label: $(grep -E '[0-9]+ (passed|failed|errors?).* in [0-9.]+s' "$log" | tail -1)"
            grep -E '^(FAILED|ERROR) ' "$log"
        } >>"$SUMMARY"
    }
    local args=("$@")
    pytest_run "leg $leg"
    crash="$(grep -m1 'Fatal Python error' "$log")"
    if [ "$rc" -gt 1 ] && [ -n "$crash" ]; then
        echo "== leg $leg: the run died (exit $rc): $crash" >>"$SUMMARY"
        echo "== leg $leg: the run died (exit $rc); once more, whole"
        pytest_run "leg $leg, run again"
    fi
    if [ "$rc" -eq 1 ]; then
        echo "== leg $leg: the failed tests once more, alone"
        pytest_run "leg $leg, failed tests run again" --last-failed
    fi
    rm -f "$log"
    return "$rc"
}

status=0
for leg in ${LEGS:-dj52 dj6}; do
    case "$leg" in
        dj52)
            (
                set -e
                VENV=.venv PIP_EXTRA="Django>=5.2,<6" EXTRAS="[test]" NEED_REDIS=1 NEED_CHROMIUM=1 \
                    source scripts/setup.sh
                echo "== leg dj52: $(.venv/bin/python -c 'import sys, django; print("Python", sys.version.split()[0], "Django", django.get_version())')"
                run_pytest dj52 .venv/bin/python "$@"
            ) || status=1
            ;;
        dj6)
            if ! py312="$(find_python312)"; then
                echo "== leg dj6: no python3.12 on PATH or in pyenv; skipped" | tee -a "$SUMMARY"
                [ "${CI:-}" = "true" ] && status=1
                continue
            fi
            (
                set -e
                VENV=.venv-dj6 PYTHON="$py312" PIP_EXTRA="Django>=6,<7" EXTRAS="[test,fast]" NEED_CHROMIUM=1 \
                    NEED_REDIS=1 source scripts/setup.sh
                echo "== leg dj6: $(.venv-dj6/bin/python -c 'import sys, django; print("Python", sys.version.split()[0], "Django", django.get_version())')"
                run_pytest dj6 .venv-dj6/bin/python "$@"
            ) || status=1
            ;;
        valkey)
            (
                set -e
                VENV=.venv PIP_EXTRA="Django>=5.2,<6" EXTRAS="[test]" NEED_REDIS=1 NEED_CHROMIUM=1 \
                    source scripts/setup.sh
                ECHOMQ_REDIS_SERVER="$(bash scripts/valkey.sh)"
                export ECHOMQ_REDIS_SERVER
                version="$("$ECHOMQ_REDIS_SERVER" --version)"  # it runs here, or the leg fails now
                echo "== leg valkey: $(echo "$version" | cut -d' ' -f1-3), $(.venv/bin/python -c 'import sys, django; print("Python", sys.version.split()[0], "Django", django.get_version())')"
                run_pytest valkey .venv/bin/python "$@"
            ) || status=1
            ;;
        *)
            echo "unknown leg $leg (dj52, dj6, valkey)" >&2
            exit 2
            ;;
    esac
done
echo "== summary"
cat "$SUMMARY"
exit "$status"
