"""Build the Cython hot paths in _ext/ into the packages that hold their pure-Python twins.

PYMQ_NO_EXTENSIONS=1 skips them; a missing compiler or Cython also skips them (with a warning), so the
install always succeeds and the twins carry the same semantics.  PYMQ_DEBUG_BUILD=1 turns on bounds
checks and line tracing for debugging.
"""
import os
import sys

from setuptools import find_packages, setup
from setuptools.command.build_ext import build_ext

# (extension module, source in _ext/) - each pairs with a twin <name>_py.py next to where it lands.
EXTENSIONS = [
    ("pymq.protocol._scanner_c", "_ext/scanner.pyx"),
    ("pymq.selector._evaluator_c", "_ext/selector.pyx"),
    ("pymq.routing._bloom_c", "_ext/bloom.pyx"),
    ("pymq_server.storage._page_alloc_c", "_ext/page_alloc.pyx"),
    ("pyspark_pymq._decode_c", "_ext/arrow_decode.pyx"),
]

DEBUG = os.environ.get("PYMQ_DEBUG_BUILD") == "1"
DIRECTIVES = {
    "language_level": "3",
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "cdivision": True,
    "linetrace": DEBUG,
}


# Spark finds Python data sources by listing top-level modules (pkgutil.iter_modules) and taking the
# ``pyspark_*`` ones that expose ``DefaultSource``.  An editable install serves its packages through an
# import hook on sys.meta_path, which that listing does not see (only a finder with ``iter_modules`` is
# listed), so ``format("pymq")`` would not resolve.  The editable wheel therefore also gets a .pth file
# that adds a finder which finds nothing itself and lists ``pyspark_pymq``; the import then goes through
# the editable hook as usual.  Regular (non-editable) installs put pyspark_pymq in site-packages, where the
# listing sees it directly.
SPARK_LOOKUP_MODULE = "__editable___pymq_spark_lookup"
SPARK_LOOKUP_SOURCE = '''"""Lists pyspark_pymq for Spark's data source lookup in an editable install of pymq (see setup.py)."""
import sys


class SparkLookup:
    """A meta-path entry that finds nothing and lists the top-level package Spark looks for."""

    def find_spec(self, fullname, path=None, target=None):
        return None

    def iter_modules(self, prefix=""):
        yield prefix + "pyspark_pymq", True


if not any(type(f).__name__ == "SparkLookup" for f in sys.meta_path):
    sys.meta_path.append(SparkLookup())
'''

try:
    from setuptools.command.editable_wheel import editable_wheel as _editable_wheel
except ImportError:  # setuptools older than 64: no PEP 660 editable installs at all
    _editable_wheel = None

if _editable_wheel is not None:
    class EditableWheel(_editable_wheel):
        def _install_namespaces(self, installation_dir, pth_prefix):
            # called once with the directory whose files become the editable wheel's top level
            super()._install_namespaces(installation_dir, pth_prefix)
            with open(os.path.join(installation_dir, SPARK_LOOKUP_MODULE + ".py"), "w") as fh:
                fh.write(SPARK_LOOKUP_SOURCE)
            with open(os.path.join(installation_dir, "__editable__.pymq-spark-lookup.pth"), "w") as fh:
                fh.write(f"import {SPARK_LOOKUP_MODULE}\n")


class OptionalBuildExt(build_ext):
    """A failing compile is not a failed install: the pure-Python twins take over."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # compiler missing, Cython missing: both are legitimate here
            self._warn(exc)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._warn(exc, ext.name)

    @staticmethod
    def _warn(exc, name="extensions"):
        sys.stderr.write(f"pymq: not building {name} ({exc}); using the pure-Python twins\n")


def extensions():
    if os.environ.get("PYMQ_NO_EXTENSIONS") == "1":
        return []
    present = [(name, src) for name, src in EXTENSIONS if os.path.exists(src)]
    try:
        from Cython.Build import cythonize
        from setuptools import Extension
    except ImportError:
        sys.stderr.write("pymq: Cython not available; using the pure-Python twins\n")
        return []
    exts = [Extension(name, [src], extra_compile_args=["-O2"] if not DEBUG else ["-O0", "-g"])
            for name, src in present]
    built = []
    for ext in exts:
        # one module that fails to translate must not take the others (or the install) down
        try:
            built += cythonize([ext], compiler_directives=DIRECTIVES, quiet=True)
        except Exception as exc:
            sys.stderr.write(f"pymq: cannot cythonize {ext.name} ({exc}); using its pure-Python twin\n")
    return built


packages = find_packages(include=["pymq", "pymq.*"])
packages += ["pymq_server"] + ["pymq_server." + p for p in find_packages("server")]
packages += ["pyspark_pymq"]

setup(
    packages=packages,
    ext_modules=extensions(),
    cmdclass={"build_ext": OptionalBuildExt,
              **({"editable_wheel": EditableWheel} if _editable_wheel is not None else {})},
)
