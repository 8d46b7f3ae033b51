#!/usr/bin/env bash
# Builds interop/java, the driver of the real Java Redisson that tests/redisson/, the mixed
# soak and the compare bench run, once for each Redisson line the project tests: 4.7.0 (the
# newest 4.x) and 3.52.0 (the last 3.x). Maven fetches Redisson and its dependencies from Maven
# Central on the first run; a build is skipped while its sources and pom are unchanged (a stamp
# in target/<version>/). Needs `java` (17 or later) and `mvn`: says so, and exits 1, without them.
set -euo pipefail
cd "$(dirname "$0")/../interop/java"
VERSIONS=(4.7.0 3.52.0)
missing=()
command -v java >/dev/null || missing+=("java (a JDK 17 or later)")
command -v mvn >/dev/null || missing+=("mvn (Maven 3)")
if [ ${#missing[@]} -gt 0 ]; then
    echo "install-java-peer.sh: missing ${missing[*]}; install them (on Debian:" \
        "apt-get install openjdk-17-jdk-headless maven) and run this script again" >&2
    exit 1
fi
if ! java -version 2>&1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])'; then
    echo "install-java-peer.sh: java is older than 17: $(java -version 2>&1 | head -1)" >&2
    exit 1
fi
# What a build depends on: the pom and every source file.
sources=$( (cat pom.xml; find src -type f | sort | xargs cat) | sha256sum | cut -d' ' -f1)
for version in "${VERSIONS[@]}"; do
    out="target/$version"
    stamp="$out/.redbaton-stamp"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sources" ] && [ -f "$out/classpath.txt" ] \
        && tr ':' '\n' < "$out/classpath.txt" | while read -r jar; do [ -f "$jar" ] || exit 1; done; then
        continue
    fi
    echo "install-java-peer.sh: building the driver against Redisson $version"
    # Bounded: a Maven Central that does not answer must fail the build, not hang it.
    if ! timeout 900 mvn -B -q -Dstyle.color=never -Dredisson.version="$version" \
        -Dmaven.wagon.http.retryHandler.count=3 -Dmaven.wagon.rto=60000 \
        compile dependency:build-classpath -Dmdep.outputFile="$PWD/$out/classpath.txt"; then
        echo "install-java-peer.sh: the Maven build against Redisson $version failed (see above)" >&2
        exit 1
    fi
    echo "$sources" > "$stamp"
done
