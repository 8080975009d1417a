#!/usr/bin/env bash
# Print the path of a valkey-server for the valkey leg of scripts/test.sh
# (docs/howto/testing.md#another-server): valkey-server on PATH, else the
# one unpacked in .valkey/ by an earlier run, else Debian's valkey-server
# package, downloaded and unpacked into .valkey/ (not installed: it would
# replace redis-server, which the other legs use). On Debian 12 the package
# is in the backports suite: when apt knows no candidate, that suite of the
# machine's own Debian source is added for the download and removed after.
# Messages go to stderr; exits non-zero when no valkey-server can be had.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if command -v valkey-server >/dev/null 2>&1; then
    command -v valkey-server
    exit 0
fi
unpacked="$PWD/.valkey/usr/bin/valkey-server"
if [ -x "$unpacked" ]; then
    echo "$unpacked"
    exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "valkey.sh: no valkey-server on PATH, and apt needs root (no sudo here)" >&2
        exit 1
    fi
    sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
candidate() {
    apt-cache policy valkey-server 2>/dev/null | awk '/Candidate:/ {print $2}'
}
have_candidate() {
    local c
    c="$(candidate)"
    [ -n "$c" ] && [ "$c" != "(none)" ]
}

added=""
work=""
cleanup() {
    set +e
    if [ -n "$added" ]; then
        $sudo rm -f "$added"
        $sudo apt-get update -qq >&2
    fi
    if [ -n "$work" ]; then
        rm -rf "$work"
    fi
}
trap cleanup EXIT

if ! have_candidate; then
    $sudo apt-get update -qq >&2 || true
fi
if ! have_candidate; then
    if [ ! -r /etc/os-release ]; then
        echo "valkey.sh: no valkey-server on PATH, and no /etc/os-release to find the release by" >&2
        exit 1
    fi
    # shellcheck disable=SC1091  # the machine's own release file
    . /etc/os-release
    uri="$({ grep -rhE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null || true; } \
        | { grep -oE 'https?://[^ ]+/debian/?( |$)' || true; } | head -1 | tr -d ' ')"
    if [ -z "$uri" ] || [ -z "${VERSION_CODENAME:-}" ]; then
        echo "valkey.sh: no valkey-server on PATH, and no Debian source to fetch it from" >&2
        exit 1
    fi
    added=/etc/apt/sources.list.d/echomq-valkey-backports.list
    echo "== adding ${VERSION_CODENAME}-backports for valkey-server (removed after)" >&2
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri ${VERSION_CODENAME}-backports main" \
        | $sudo tee "$added" >/dev/null
    $sudo apt-get update -qq >&2
fi
if ! have_candidate; then
    echo "valkey.sh: apt has no valkey-server package" >&2
    exit 1
fi

echo "== fetching valkey-server $(candidate) into .valkey/" >&2
work="$(mktemp -d)"
# valkey-server holds the link, valkey-tools the binary it names
(cd "$work" && apt-get download -q valkey-server valkey-tools >&2)
for deb in "$work"/*.deb; do
    dpkg -x "$deb" "$work/root"
done
# moved into place only once it runs (a binary missing a library does not)
"$work/root/usr/bin/valkey-server" --version >&2
rm -rf .valkey
mv "$work/root" .valkey
echo "$unpacked"
