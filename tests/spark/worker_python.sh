#!/bin/sh
# The interpreter of the Spark suite's Python workers (PYSPARK_PYTHON, tests/spark/conftest.py).  Spark puts
# $SPARK_HOME/python/lib/pyspark.zip and py4j-*.zip first on a worker's PYTHONPATH; Python compiles every
# module it imports from a zip again at each start (zipimport keeps no bytecode cache), so a worker took
# 3.2-3.5 s to import what the installed pyspark, the same release with its __pycache__, imports in 1.0-1.7 s
# (load ~16). A Python streaming source's worker must connect back within Spark's fixed 10 s
# (PythonWorkerFactory.createSimpleWorker; no setting reaches it), so the zips are dropped here.
PYTHONPATH=$(printf '%s' "${PYTHONPATH:-}" | tr ':' '\n' | grep -v -E '/python/lib/(pyspark|py4j-[^/]*)\.zip$' | paste -s -d ':' -)
export PYTHONPATH
exec "${PYMQ_WORKER_PYTHON:?set by tests/spark/conftest.py}" "$@"
