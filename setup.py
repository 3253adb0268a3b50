"""Build the Cython hot paths in _ext/ into the packages that hold their pure-Python twins.

A module that cannot be built (no C compiler, no Python headers, no Cython) fails the build, naming each
module and the two ways on: install the compiler, or choose the pure-Python twins.  pip shows a build's
output only when the build fails (or with -v): a warning on a build that goes on would never reach the
person installing.  PYMQ_NO_EXTENSIONS=1 chooses the twins deliberately (nothing is compiled, nothing to
warn about); PYMQ_REQUIRE_EXTENSIONS=0 lets a build that cannot compile go on with the twins, with a
banner on stderr (seen under ``python -m build`` or ``pip -v``; ``pymq-server`` names every missing
module again at start-up).  PYMQ_DEBUG_BUILD=1 turns on bounds checks and line tracing for debugging.
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
    ("pymq.routing._topics_c", "_ext/topics.pyx"),
    ("pymq_server.storage._page_alloc_c", "_ext/page_alloc.pyx"),
    ("pymq_server.broker._send_c", "_ext/send.pyx"),
    ("pymq_server.broker._message_c", "_ext/message.pyx"),
    ("pyspark_pymq._decode_c", "_ext/arrow_decode.pyx"),
]

DEBUG = os.environ.get("PYMQ_DEBUG_BUILD") == "1"
REQUIRE = os.environ.get("PYMQ_REQUIRE_EXTENSIONS", "1") != "0"    # the default: see the docstring


def skipped(what: str, reason: object) -> None:
    """A compiled module cannot be built: fail the build (PYMQ_REQUIRE_EXTENSIONS=1) or say so loudly."""
    if REQUIRE:
        bar = "pymq: " + "*" * 72
        raise SystemExit(f"{bar}\npymq: cannot build {what}: {reason}\n"
                         f"pymq: install a C compiler and the Python headers (Debian: apt-get install gcc "
                         f"python3-dev) and build again; or install the pure-Python twins, same behaviour and "
                         f"several times slower: PYMQ_NO_EXTENSIONS=1 (or PYMQ_REQUIRE_EXTENSIONS=0 to compile "
                         f"what can be); PYMQ_REQUIRE_EXTENSIONS=1 makes this an error (the default)\n{bar}")
    bar = "pymq: " + "*" * 72
    sys.stderr.write(f"{bar}\npymq: WARNING: not building {what} ({reason})\n"
                     f"pymq: this installation runs the pure-Python twin instead: same behaviour, several "
                     f"times slower (PYMQ_REQUIRE_EXTENSIONS=0 asked for this).\npymq: install gcc and "
                     f"python3-dev (Debian) to compile it\n{bar}\n")

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
    """A failing compile is not a failed install (the pure-Python twins take over) unless
    PYMQ_REQUIRE_EXTENSIONS=1; either way it is never silent."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # compiler missing, Cython missing: both are legitimate here
            skipped("the compiled core", exc)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:
            skipped(ext.name, exc)


def extensions():
    if os.environ.get("PYMQ_NO_EXTENSIONS") == "1":
        return []
    present = [(name, src) for name, src in EXTENSIONS if os.path.exists(src)]
    try:
        from Cython.Build import cythonize
        from setuptools import Extension
    except ImportError as exc:
        skipped("the compiled core", f"Cython is not available: {exc}")
        return []
    exts = [Extension(name, [src], extra_compile_args=["-O2"] if not DEBUG else ["-O0", "-g"])
            for name, src in present]
    built = []
    for ext in exts:
        # one module that fails to translate must not take the others (or the install) down
        try:
            built += cythonize([ext], compiler_directives=DIRECTIVES, quiet=True)
        except Exception as exc:
            skipped(ext.name, f"Cython cannot translate it: {exc}")
    return built


packages = find_packages(include=["pymq", "pymq.*"])
packages += ["pymq_server"] + ["pymq_server." + p for p in find_packages("server")]
packages += ["pymq_server.admin.console"]     # the web console's files: a data-only package
packages += ["pyspark_pymq"]

setup(
    packages=packages,
    ext_modules=extensions(),
    cmdclass={"build_ext": OptionalBuildExt,
              **({"editable_wheel": EditableWheel} if _editable_wheel is not None else {})},
)
