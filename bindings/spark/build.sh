#!/usr/bin/env bash
# Build the JVM Spark connector, bindings/spark/target/pymq-spark.jar, against the Spark of the installed
# pyspark (its jars/ directory), after installing the Java binding (bindings/java, whose STOMP classes it
# packs) into the local Maven repository.
#
#   bindings/spark/build.sh              # package (runs the module's unit tests)
#   bindings/spark/build.sh -DskipTests  # extra arguments go to Maven
#
# Environment: PYMQ_PYTHON (the interpreter whose pyspark to build against; default python3), PYMQ_MVN
# (mvn). Prints the jar's path last. Quick the second time: Maven skips what is up to date.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYMQ_PYTHON:-python3}
MVN=${PYMQ_MVN:-mvn}

JARS=$("$PY" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
[ -d "$JARS" ] || { echo "build.sh: no pyspark jars directory at $JARS" >&2; exit 1; }
LIB="$HERE/target/spark-lib"
mkdir -p "$LIB"
# versionless links, so the pom names the same files whatever versions this pyspark ships
for prefix in spark-sql_2 spark-sql-api_2 spark-catalyst_2 spark-core_2 spark-common-utils_2 \
              spark-common-utils-java_2 spark-unsafe_2 scala-library arrow-vector arrow-memory-core \
              arrow-memory-netty-buffer-patch arrow-memory-netty arrow-format flatbuffers-java netty-buffer \
              netty-common jackson-core jackson-databind jackson-annotations slf4j-api kryo-shaded; do
    found=""
    for jar in "$JARS/$prefix"-[0-9]*.jar "$JARS/$prefix"*.jar; do
        [ -f "$jar" ] || continue
        case "$prefix" in
            arrow-memory-netty) case "$jar" in *buffer-patch*) continue ;; esac ;;
            spark-common-utils_2) ;;
        esac
        found=$jar
        break
    done
    [ -n "$found" ] || { echo "build.sh: no $prefix jar in $JARS" >&2; exit 1; }
    name=${prefix%_2}
    ln -sf "$found" "$LIB/$name.jar"
done

# the unit tests run against all of Spark's own jars (Spark's types need its whole runtime)
RUNTIME=$(ls "$JARS"/*.jar | paste -sd, -)
"$MVN" -B -q -f "$HERE/../java/pom.xml" install -DskipTests >&2
"$MVN" -B -q -f "$HERE/pom.xml" -Dspark.lib="$LIB" -Dmaven.test.additionalClasspath="$RUNTIME" package "$@" >&2
echo "$HERE/target/pymq-spark.jar"
