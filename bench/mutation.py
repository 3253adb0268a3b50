"""Hand-made mutants of the modules that carry pymq's guarantees, each run against the tests that guard it
(issue 31): a dropped table row, a flipped or off-by-one comparison, a skipped validation, a widened rule.

    python -m bench.mutation                 # every mutant (about 20-40 min on a shared 2-core machine)
    python -m bench.mutation --only acl      # the mutants whose id starts with "acl"
    python -m bench.mutation --list          # what would run

Each mutant replaces one exact piece of text of one module (the script refuses a mutant whose text is no
longer found exactly once: the module changed, update the list) in a private copy of the source tree — never
the checkout — and runs ``pytest -x`` on its test selection there, with ``CI=1`` (hypothesis derandomized:
a kill never depends on the seed) and the copy first on ``PYTHONPATH`` (``pymq_server`` through the copy's
tools/mypy link, so a pymq-server child runs the mutant too).  Killed: pytest failed.  Survived: it passed.
The compiled twins are not mutated (a mutant of a ``_py`` twin is killed by the twin tests' ``py`` half).

``EQUIVALENT`` lists mutants that cannot change what any client or operator sees, with why; they are run
too (a test that kills one is fine) but do not count against the kill rate.  The figures of the last run
are in bench/README.md ("Mutation run").
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    id: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    equivalent: str = ""  # why it cannot be told apart from the original, when it cannot


STATES_T = (
    "tests/broker/test_entry_lifecycle.py",
    "-k",
    "not specified",
    "tests/storage/test_delivery_state.py",
    "tests/hostile/test_bulk_delivery.py",
)
#: the rules asked of acl.py directly come first: with ``-x`` a mutant they kill is decided in seconds; the
#: broker-level tests after them (the matrix: ~6 min on the shared machine) run in full only for a survivor
ACL_T = (
    "tests/broker/test_acl_rules.py",
    "tests/broker/test_permission_derived.py",
    "tests/broker/test_access_control.py",
    "tests/broker/test_derived_names.py",
    "tests/broker/test_permission_matrix.py",
)
PLACE_T = (
    "tests/broker/test_overflow_edges.py",
    "tests/broker/test_placement.py",
    "tests/broker/test_placement_agreement.py",
    "tests/broker/test_last_value_depth.py",
    "tests/broker/test_app_transaction_placement.py",
)
RECOVERY_T = (
    "tests/storage/test_file_recovery_damage.py",
    "tests/storage/test_file_device.py",
    "tests/storage/test_file_logcut.py",
    "-k",
    "not every_byte_offset",  # minutes on a shared machine; the cut tests around it stay
)
SELECTOR_T = ("tests/selector",)
NUMBERS_T = ("tests/protocol/test_numbers.py", "tests/protocol/test_scanner.py")
PLAN_T = ("tests/spark/test_plan.py",)
GAPS_T = ("tests/spark/test_gaps.py", "-k", "python")

S = "server/broker/states.py"
A = "server/broker/acl.py"
P = "server/broker/placement_rules.py"
R = "server/storage/file/recovery.py"
E = "pymq/selector/_evaluator_py.py"
N = "pymq/protocol/numbers.py"
L = "pyspark_pymq/_plan.py"
SRC = "pyspark_pymq/source.py"

_ROWS = [
    "(SCHEDULED, Event.DUE): READY",
    "(SCHEDULED, Event.PURGE): COMPLETED",
    "(SCHEDULED, Event.EXPIRE): EXPIRED",
    "(READY, Event.ACQUIRE): ACQUIRED",
    "(READY, Event.EXPIRE): EXPIRED",
    "(READY, Event.PURGE): COMPLETED",
    "(READY, Event.DELAY): SCHEDULED",
    "(READY, Event.DEAD): DEAD",
    "(READY, Event.REPLACE): COMPLETED",
    "(SCHEDULED, Event.REPLACE): COMPLETED",
    "(ACQUIRED, Event.ACK): COMPLETED",
    "(ACQUIRED, Event.RELEASE): READY",
    "(ACQUIRED, Event.DEAD): DEAD",
    "(ACQUIRED, Event.EXPIRE): EXPIRED",
]

MUTANTS: list[Mutant] = [
    *[
        Mutant(f"states-row-{row.split(')')[0][1:].replace(', Event.', '-').lower()}", S, f"    {row},", "", STATES_T)
        for row in _ROWS
    ],
    Mutant("states-delay-to-ready", S, "(READY, Event.DELAY): SCHEDULED", "(READY, Event.DELAY): READY", STATES_T),
    Mutant(
        "states-release-to-scheduled",
        S,
        "(ACQUIRED, Event.RELEASE): READY",
        "(ACQUIRED, Event.RELEASE): SCHEDULED",
        STATES_T,
    ),
    Mutant(
        "acl-monitor-passes-every-check",
        A,
        "permission: str) -> bool:\n        if is_admin(user):",
        "permission: str) -> bool:\n        if may_monitor(user):",
        ACL_T,
    ),
    Mutant(
        "acl-manage-on-system-implies",
        A,
        "own.granted(user, permission, manage_implies=False)",
        "own.granted(user, permission, manage_implies=True)",
        ACL_T,
    ),
    Mutant(
        "acl-empty-principal-name",
        A,
        'len(principal.split(":", 1)[1]) > 0',
        'len(principal.split(":", 1)[1]) >= 0',
        ACL_T,
    ),
    Mutant(
        "acl-create-on-system-owned", A, 'if permission in ("create", "manage"):', 'if permission == "manage":', ACL_T
    ),
    Mutant(
        "acl-inherits-every-permission",
        A,
        "return permission in INHERITED and inherited.allows(user, permission)",
        "return inherited.allows(user, permission)",
        ACL_T,
    ),
    Mutant(
        "acl-purge-not-inherited",
        A,
        'INHERITED = frozenset({"consume", "browse", "purge"})',
        'INHERITED = frozenset({"consume", "browse"})',
        ACL_T,
    ),
    Mutant(
        "acl-manage-implies-nothing",
        A,
        'permission in have or (manage_implies and "manage" in have)',
        "permission in have",
        ACL_T,
    ),
    Mutant(
        "acl-empty-grant-seen",
        A,
        "return any(self.grants.get(p) for p in _principals(user))",
        "return any(p in self.grants for p in _principals(user))",
        ACL_T,
    ),
    Mutant("acl-no-everyone-principal", A, '    yield "*"\n', "", ACL_T),
    Mutant(
        "acl-any-role-is-admin",
        A,
        "        if ADMIN_ROLE in user.roles:        # allows()",
        "        if user.roles:        # allows()",
        ACL_T,
    ),
    Mutant(
        "acl-temp-topic-checked",
        A,
        'if destination.startswith(("/temp-queue/", "/temp-topic/")):',
        'if destination.startswith(("/temp-queue/",)):',
        ACL_T,
    ),
    Mutant(
        "acl-claim-system-owned",
        A,
        'if self.system_source(destination) is None and own is not None and own.allows(user, "create"):',
        'if own is not None and own.allows(user, "create"):',
        ACL_T,
    ),
    Mutant(
        "acl-first-grant-keeps-create",
        A,
        'p: set(v) - {"create"} for p, v in self.defaults.grants.items()',
        "p: set(v) for p, v in self.defaults.grants.items()",
        ACL_T,
    ),
    Mutant("acl-unknown-permission-accepted", A, "bad = perms - set(PERMISSIONS)", "bad: set[str] = set()", ACL_T),
    Mutant(
        "acl-monitor-sees-nothing",
        A,
        "return ADMIN_ROLE in user.roles or MONITOR_ROLE in user.roles",
        "return ADMIN_ROLE in user.roles",
        ACL_T,
    ),
    Mutant(
        "acl-owner-holds-nothing",
        A,
        "            return True\n        return self.granted(user, permission)",
        "            pass\n        return self.granted(user, permission)",
        ACL_T,
    ),
    Mutant(
        "acl-anyone-changes-grants",
        A,
        '        self.check_manage(actor, destination, "change permissions on")\n',
        "",
        ACL_T,
    ),
    Mutant(
        "acl-dead-letters-seen-through-any-permission",
        A,
        "any(inherited.allows(user, p) for p in INHERITED)",
        "any(inherited.allows(user, p) for p in PERMISSIONS)",
        ACL_T,
    ),
    Mutant(
        "acl-topic-patterns-ignored",
        A,
        "                return any(acl.allows(user, permission) for acl in covering)",
        "                pass",
        ACL_T,
    ),
    Mutant(
        "acl-pattern-covers-everything",
        A,
        "and topic_patterns.covers(pattern[len(TOPIC):], name)]",
        "]",
        ACL_T,
    ),
    Mutant(
        "placement-inbound-skips-schema",
        P,
        "EntryPath.CLUSTER_INBOUND: _ALL - {Rule.ROUTING},",
        "EntryPath.CLUSTER_INBOUND: _ALL - {Rule.ROUTING, Rule.SCHEMA},",
        PLACE_T,
    ),
    Mutant(
        "placement-bulk-skips-depth",
        P,
        "EntryPath.BULK_QUEUE: _ALL,",
        "EntryPath.BULK_QUEUE: _ALL - {Rule.DEPTH},",
        PLACE_T,
    ),
    Mutant(
        "placement-transaction-skips-dedup",
        P,
        "EntryPath.APP_TRANSACTION: _ALL,",
        "EntryPath.APP_TRANSACTION: _ALL - {Rule.DEDUP},",
        PLACE_T,
    ),
    Mutant(
        "placement-publish-skips-dedup",
        P,
        "EntryPath.PUBLISH: frozenset({Rule.DEDUP, Rule.ROUTING, Rule.RETAINED_LOG, Rule.STORE}),",
        "EntryPath.PUBLISH: frozenset({Rule.ROUTING, Rule.RETAINED_LOG, Rule.STORE}),",
        PLACE_T,
    ),
    Mutant(
        "placement-dead-letter-refusable",
        P,
        "EntryPath.DEAD_LETTER: frozenset({Rule.RETAINED_LOG, Rule.STORE}),",
        "EntryPath.DEAD_LETTER: frozenset({Rule.RETAINED_LOG, Rule.STORE, Rule.DEPTH}),",
        PLACE_T,
    ),
    Mutant("placement-depth-off-by-one", P, "    if depth + grows > limit:", "    if depth + grows >= limit:", PLACE_T),
    Mutant(
        "placement-unit-keys-ignored",
        P,
        "out.append(value not in waiting and value not in earlier)",
        "out.append(value not in waiting)",
        PLACE_T,
    ),
    Mutant(
        "placement-drop-oldest-late",
        P,
        "return bool(limit) and queue.depth >= limit and",
        "return bool(limit) and queue.depth > limit and",
        PLACE_T,
    ),
    Mutant(
        "placement-block-late",
        P,
        "bool(config.max_depth) and queue.depth >= config.max_depth",
        "bool(config.max_depth) and queue.depth > config.max_depth",
        PLACE_T,
    ),
    Mutant("placement-unit-dedup-ignored", P, "if ahead is not None and dedup_id in ahead.ids:", "if False:", PLACE_T),
    Mutant(
        "placement-unit-depth-ignored",
        P,
        "    if grows:\n        ahead.grows += 1",
        "    if False:\n        ahead.grows += 1",
        PLACE_T,
    ),
    Mutant(
        "placement-no-grow-check-skipped",
        P,
        'if not limit or config.overflow != "reject" or not grows:',
        'if not limit or config.overflow != "reject":',
        PLACE_T,
        equivalent="with grows == 0 the check is depth + 0 > limit, and a reject queue's depth never passes "
        "its limit (every path that adds checks first)",
    ),
    Mutant(
        "recovery-body-checksum-skipped",
        R,
        "        if crc32c(data) != fields[8]:\n            return self.store.index.read(key)",
        "        if False:\n            return self.store.index.read(key)",
        RECOVERY_T,
    ),
    Mutant("recovery-page-number-unchecked", R, " or page_no != number:", ":", RECOVERY_T),
    Mutant("recovery-page-kind-unchecked", R, " or kind != PERSISTENT or ", " or ", RECOVERY_T),
    Mutant(
        "recovery-tail-swept",
        R,
        "if not page.cont and page.live_count == 0 and tail is not page:",
        "if not page.cont and page.live_count == 0:",
        RECOVERY_T,
        equivalent="free_page() also unsets the tail it frees: an empty tail freed at recovery costs the next "
        "message a fresh page, nothing else (tests/storage/test_file_recovery_damage.py checks every later "
        "message comes back)",
    ),
    Mutant(
        "recovery-continuations-swept",
        R,
        "if not page.cont and page.live_count == 0 and tail is not page:",
        "if page.live_count == 0 and tail is not page:",
        RECOVERY_T,
    ),
    Mutant(
        "recovery-directory-checksum-skipped",
        R,
        "if fields[9] != crc32c(raw[at:at + body_size]):",
        "if False:",
        RECOVERY_T,
    ),
    Mutant(
        "recovery-uncommitted-units-applied", R, "            if frame.commit:\n", "            if True:\n", RECOVERY_T
    ),
    Mutant(
        "recovery-unreferenced-kept",
        R,
        "            if number not in referenced:\n                pages.alloc.free(number)",
        "            if False:\n                pages.alloc.free(number)",
        RECOVERY_T,
        equivalent="a page nothing references stays allocated until the next checkpoint's sweep of the "
        "allocator: space, not a message, is what it costs (tests/storage/test_file_breathing.py "
        "measures space)",
    ),
    Mutant(
        "recovery-log-put-checksum-skipped",
        R,
        "if crc32c(data) != data_crc or len(data) != length:",
        "if len(data) != length:",
        RECOVERY_T,
        equivalent="every log frame is checksummed as a whole (wal.py); a PUT whose record checksum fails "
        "inside a valid frame cannot be written by the device",
    ),
    Mutant(
        "recovery-fast-path-slot-checksum-skipped",
        R,
        "if fields[9] != crc32c(image[at:at + fmt.SLOT_BODY.size]) or fields[7] & fmt.FLAG_LARGE:",
        "if fields[7] & fmt.FLAG_LARGE:",
        RECOVERY_T,
        equivalent="the same slot's checksum was verified when the directory was loaded at open "
        "(recovery-directory-checksum-skipped); the image read later is the same bytes",
    ),
    Mutant(
        "recovery-image-cache-unbounded",
        R,
        "if len(images) >= 64:",
        "if len(images) >= 10 ** 9:",
        RECOVERY_T,
        equivalent="a bound on memory held while recovering, not on what comes back",
    ),
    Mutant(
        "selector-long-range-ignored",
        E,
        "        return v if LONG_MIN <= v <= LONG_MAX else None  # type: ignore",
        "        return v  # type: ignore",
        SELECTOR_T,
    ),
    Mutant("selector-bytes-compare-equal", E, 'if ca != cb or ca == "other":', "if ca != cb:", SELECTOR_T),
    Mutant(
        "selector-and-no-false-wins",
        E,
        "            if r is False:\n                return False",
        "            if r is False:\n                result = False",
        SELECTOR_T,
    ),
    Mutant(
        "selector-or-no-true-wins",
        E,
        "            if r is True:\n                return True",
        "            if r is True:\n                result = True",
        SELECTOR_T,
    ),
    Mutant("selector-not-of-unknown", E, "return None if v is None else not v", "return not v", SELECTOR_T),
    Mutant(
        "selector-between-exclusive",
        E,
        'a = compare(">=", v, lo(values))',
        'a = compare(">", v, lo(values))',
        SELECTOR_T,
    ),
    Mutant(
        "selector-notbetween-inclusive",
        E,
        'a = compare("<", v, lo(values))',
        'a = compare("<=", v, lo(values))',
        SELECTOR_T,
    ),
    Mutant(
        "selector-like-on-non-string",
        E,
        "            if not isinstance(v, str):\n                return None\n            return matcher(v)",
        "            if v is None:\n                return None\n            return matcher(v)",
        SELECTOR_T,
    ),
    Mutant(
        "selector-isnull-falsy",
        E,
        "return lambda values: inner(values) is None",
        "return lambda values: not inner(values)",
        SELECTOR_T,
    ),
    Mutant("selector-division-by-zero", E, "        if divisor == 0.0:\n            return None\n", "", SELECTOR_T),
    Mutant(
        "selector-overflow-kept",
        E,
        "        return r if LONG_MIN <= r <= LONG_MAX else None",
        "        return r",
        SELECTOR_T,
        equivalent="an int outside 64 bits is no number to every reader of the result (compare, arith, IN, "
        "BETWEEN all give UNKNOWN for it, and IS NULL applies to identifiers only): the same as NULL",
    ),
    Mutant(
        "selector-negation-overflow",
        E,
        "return -x if -x <= LONG_MAX else None",
        "return -x",
        SELECTOR_T,
        equivalent="an int outside 64 bits is no number to every reader of the result (compare, arith, IN, "
        "BETWEEN all give UNKNOWN for it, and IS NULL applies to identifiers only): the same as NULL",
    ),
    Mutant(
        "selector-in-non-string",
        E,
        "            if not isinstance(v, str):\n                return None\n            return v in strings",
        "            return v in strings",
        SELECTOR_T,
    ),
    Mutant(
        "selector-strings-ordered",
        E,
        "    return None                          # strings and booleans are not ordered",
        '    return (a < b) if op == "<" else None  # type: ignore[operator]',
        SELECTOR_T,
    ),
    Mutant(
        "selector-like-single-group-prefix",
        E,
        "return n == first[0] and _group_at(first, v, 0)",
        "return n >= first[0] and _group_at(first, v, 0)",
        SELECTOR_T,
    ),
    Mutant(
        "selector-cond-passes-non-boolean", E, "return v if v is True or v is False else None", "return v", SELECTOR_T
    ),
    Mutant(
        "selector-bool-type-check",
        E,
        "    if t is bool or v is None:\n        return None",
        "    if v is None:\n        return None",
        SELECTOR_T,
        equivalent="a bool reaches the isinstance(v, bool) test two lines down and is refused there",
    ),
    Mutant("numbers-digits-off-by-one", N, "if len(digits) > MAX_DIGITS:", "if len(digits) >= MAX_DIGITS:", NUMBERS_T),
    Mutant(
        "numbers-maximum-exclusive", N, "if n < minimum or n > maximum:", "if n < minimum or n >= maximum:", NUMBERS_T
    ),
    Mutant("numbers-minimum-ignored", N, "if n < minimum or n > maximum:", "if n > maximum:", NUMBERS_T),
    Mutant("numbers-sign-on-zero-minimum", N, "(negative and minimum >= 0)", "(negative and minimum > 0)", NUMBERS_T),
    Mutant("numbers-unicode-digits", N, "not digits.isascii() or ", "", NUMBERS_T),
    Mutant("numbers-empty-header-parsed", N, 'if value is None or value == "":', "if value is None:", NUMBERS_T),
    Mutant("numbers-twenty-digits", N, "MAX_DIGITS: Final = 19", "MAX_DIGITS: Final = 20", NUMBERS_T),
    Mutant(
        "plan-negative-width",
        L,
        "return max(0, self.end - self.start)",
        "return self.end - self.start",
        PLAN_T,
        equivalent="width is read only by split(), after it drops every span whose width is not positive",
    ),
    Mutant(
        "plan-cap-shares-past-available",
        L,
        "if shares[d] < avail[d]:",
        "if shares[d] <= avail[d]:",
        PLAN_T,
        equivalent="while total > max_messages every share is max_messages * a // total < a: the test is always true",
    ),
    Mutant("plan-more-parts-than-messages", L, "        parts = min(parts, span.width)\n", "", PLAN_T),
    Mutant(
        "plan-split-remainder",
        L,
        "hi = lo + step + (1 if i < extra else 0)",
        "hi = lo + step + (1 if i <= extra else 0)",
        PLAN_T,
    ),
    Mutant(
        "plan-bytes-probe-cut-at-target",
        L,
        "if c.bytes >= 2 * target and n > 1:",
        "if c.bytes > 2 * target and n > 1:",
        PLAN_T,
    ),
    Mutant(
        "plan-bytes-piece-past-target",
        L,
        "if lo >= 0 and acc + c.bytes > target:",
        "if lo >= 0 and acc + c.bytes >= target:",
        PLAN_T,
    ),
    Mutant(
        "plan-offset-accepts-bool",
        L,
        "type(parts[PARTITION]) is not int",
        "not isinstance(parts[PARTITION], int)",
        PLAN_T,
    ),
    Mutant(
        "plan-cap-all-when-equal",
        L,
        "if total <= max_messages:",
        "if total < max_messages:",
        PLAN_T,
        equivalent="with total == max_messages every share is max_messages * a // total == a and nothing is "
        "left over: the same ends",
    ),
    Mutant("gap-read-one-message", SRC, "    if earliest > cursor:\n", "    if earliest > cursor + 1:\n", GAPS_T),
    Mutant(
        "gap-plan-one-message",
        SRC,
        "            if earliest > pos[dest]:\n",
        "            if earliest > pos[dest] + 1:\n",
        GAPS_T,
    ),
]


def _copy_tree(dest: Path) -> None:
    skip = {
        ".git",
        ".venv",
        "node_modules",
        ".hypothesis",
        ".mypy_cache",
        "target",
        "bindings",
        "mutants",
        "__pycache__",
        "build",
        "dist",
        "test-artifacts",
    }
    shutil.copytree(ROOT, dest, ignore=lambda _d, names: [n for n in names if n in skip], symlinks=True)


def run(mutants: list[Mutant], keep: bool) -> int:
    work = Path(tempfile.mkdtemp(prefix="pymq-mutation-"))
    tree = work / "src"
    _copy_tree(tree)
    env = {
        **os.environ,
        "CI": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "tools" / "mypy"), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("HYPOTHESIS_PROFILE", None)
    check = subprocess.run(
        [sys.executable, "-c", "import pymq_server, pymq; print(pymq_server.__file__, pymq.__file__)"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    if str(tree) not in check.stdout:
        print(f"the copy is not what Python imports: {check.stdout}{check.stderr}", file=sys.stderr)
        return 2
    results = []
    try:
        # every selection must pass unmutated first, in the copy: otherwise a "kill" means nothing
        for tests in dict.fromkeys(m.tests for m in mutants):
            base = subprocess.run(
                [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--timeout", "300", *tests],
                cwd=tree,
                env=env,
                capture_output=True,
                text=True,
                timeout=3600,
            )
            print(f"baseline {' '.join(tests)}: {'passes' if base.returncode == 0 else 'FAILS'}", flush=True)
            if base.returncode != 0:
                print(base.stdout[-3000:], base.stderr[-2000:], file=sys.stderr)
                return 2
        for m in mutants:
            path = tree / m.path
            original = path.read_text()
            if original.count(m.old) != 1:
                results.append((m, "stale", 0.0))
                print(f"{m.id:44} STALE (its text is not found exactly once in {m.path})", flush=True)
                continue
            path.write_text(original.replace(m.old, m.new))
            t0 = time.monotonic()
            try:
                done = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "pytest",
                        "-x",
                        "-q",
                        "-p",
                        "no:cacheprovider",
                        "--timeout",
                        "300",
                        *m.tests,
                    ],
                    cwd=tree,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=1800,
                )
                outcome = "killed" if done.returncode != 0 else "survived"
                if done.returncode not in (0, 1):
                    outcome = f"killed (exit {done.returncode})"
            except subprocess.TimeoutExpired:
                outcome = "killed (timeout)"
            finally:
                path.write_text(original)
            seconds = time.monotonic() - t0
            results.append((m, outcome, seconds))
            tag = " [equivalent]" if m.equivalent else ""
            print(f"{m.id:44} {outcome:18} {seconds:6.1f}s{tag}", flush=True)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    counted = [(m, o) for m, o, _ in results if not m.equivalent and o != "stale"]
    killed = sum(1 for _, o in counted if o.startswith("killed"))
    equivalent = [m for m, _, _ in results if m.equivalent]
    print(
        f"\nnon-equivalent mutants killed: {killed} of {len(counted)}"
        + (f" ({100 * killed / len(counted):.0f} %)" if counted else "")
    )
    print(f"equivalent (not counted): {len(equivalent)}; stale: {sum(1 for _, o, _ in results if o == 'stale')}")
    for m, o in counted:
        if not o.startswith("killed"):
            print(f"SURVIVED {m.id}: {m.path}: {m.old.strip()!r} -> {m.new.strip()!r}")
    return 0 if killed == len(counted) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], help="run mutants whose id starts with this")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--keep", action="store_true", help="keep the private copy (its path is printed)")
    parser.add_argument("--tests", nargs="+", help="run these pytest arguments instead of each mutant's own selection")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.only or any(m.id.startswith(o) for o in args.only)]
    if args.tests:
        chosen = [Mutant(m.id, m.path, m.old, m.new, tuple(args.tests), m.equivalent) for m in chosen]
    if args.list:
        for m in chosen:
            print(f"{m.id:44} {m.path}" + (f"  [equivalent: {m.equivalent}]" if m.equivalent else ""))
        return 0
    return run(chosen, args.keep)


if __name__ == "__main__":
    sys.exit(main())
