"""The access rules of spec/admin.md ("Ownership and permissions") asked of the access control itself, in
milliseconds: who may do what to which destination, and what a refusal leaves behind.

tests/broker/test_permission_matrix.py proves the same rules against a running broker, one cell per
principal and operation (minutes); this file exists so that a mutant of server/broker/acl.py is decided
in seconds (``python -m bench.mutation --only acl``, issue 31).  Each test states a rule as a user meets
it — bob may or may not consume, claim, see — never the shape of the code.  The dead-letter queue
``DLQ.orders`` serves ``/queue/orders`` and ``/queue/expired`` is the expiry queue, wired the way the
destinations layer does it (server/broker/deadletters.py ``system_source``).
"""
from __future__ import annotations

import pytest

from pymq.errors import AccessDenied, ConfigError
from pymq_server.broker.acl import OPEN_DEFAULTS, PERMISSIONS, AccessControl, DestinationAcl, may_monitor
from pymq_server.broker.auth import ANONYMOUS, User

ROOT = User("root", "", frozenset({"admin"}))
ALICE = User("alice", "", frozenset({"apps"}))
BOB = User("bob", "", frozenset())
CAROL = User("carol", "", frozenset({"auditors"}))
MON = User("mon", "", frozenset({"monitor"}))

ORDERS, DLQ, EXPIRY = "/queue/orders", "/queue/DLQ.orders", "/queue/expired"


def control(defaults: dict | None = None) -> AccessControl:
    acl = AccessControl(defaults)

    def system_source(destination: str) -> DestinationAcl | None:
        if destination == EXPIRY:
            return DestinationAcl()
        if destination == DLQ:
            return acl.acls.get(ORDERS) or acl.defaults
        return None
    acl.system_source = system_source
    return acl


def may(acl: AccessControl, user: User, destination: str, permission: str) -> bool:
    """What the broker answers to ``user`` doing ``permission`` on ``destination`` (SEND, SUBSCRIBE,
    a browse, a purge): the check it makes, refused or not."""
    try:
        acl.authorize(user, destination, permission)
    except AccessDenied as refused:
        assert (refused.user, refused.permission) == (user.name, permission), refused  # type: ignore[attr-defined]
        return False
    return True


def claims(acl: AccessControl, user: User, destination: str, *, exists: bool) -> bool:
    try:
        acl.check_create(user, destination, claim=exists)
    except AccessDenied:
        return False
    return True


# -- the administrator, the monitor, roles ----------------------------------------------------------------------
def test_the_administrator_may_do_everything_a_plain_role_nothing_it_was_not_granted():
    acl = control({})
    acl.own(ORDERS, "alice")
    for permission in PERMISSIONS:
        assert may(acl, ROOT, ORDERS, permission), permission
        assert not may(acl, CAROL, ORDERS, permission), permission     # a role, not the admin role
        assert not may(acl, MON, ORDERS, permission), permission       # the monitor reads metrics only


def test_the_monitor_role_reads_metrics_and_a_plain_user_does_not():
    assert may_monitor(MON) and may_monitor(ROOT)
    assert not may_monitor(BOB) and not may_monitor(CAROL) and not may_monitor(ANONYMOUS)


def test_the_monitor_passes_no_destination_check():
    acl = control()                                 # open defaults: everyone may produce on queues nobody owns
    acl.own(ORDERS, "alice")
    assert not acl.allows(MON, ORDERS, "consume") and not acl.sees(MON, ORDERS)
    with pytest.raises(AccessDenied):
        acl.check_manage(MON, ORDERS, "drop")
    assert not claims(acl, MON, DLQ, exists=False)


# -- owners, grants, principals ---------------------------------------------------------------------------------
def test_an_owner_holds_everything_a_grant_only_what_it_names():
    acl = control({})
    acl.own(ORDERS, "alice", {"user:bob": ["consume"], "role:auditors": ["browse"], "*": ["produce"]})
    assert all(may(acl, ALICE, ORDERS, p) for p in PERMISSIONS)
    assert [p for p in PERMISSIONS if may(acl, BOB, ORDERS, p)] == ["produce", "consume"]
    assert [p for p in PERMISSIONS if may(acl, CAROL, ORDERS, p)] == ["produce", "browse"]
    assert [p for p in PERMISSIONS if may(acl, ANONYMOUS, ORDERS, p)] == ["produce"]    # '*': everyone


def test_manage_on_an_ordinary_queue_implies_every_other_permission():
    acl = control({})
    acl.own(ORDERS, "alice", {"user:bob": ["manage"]})
    assert all(may(acl, BOB, ORDERS, p) for p in PERMISSIONS)
    acl.check_manage(BOB, ORDERS, "drop")
    acl.grant(BOB, ORDERS, "user:carol", ["consume"])                  # a manager grants
    assert may(acl, CAROL, ORDERS, "consume")


def test_only_an_owner_a_manager_or_the_administrator_grants_and_a_refusal_changes_nothing():
    acl = control({})
    acl.own(ORDERS, "alice", {"user:bob": ["consume", "produce", "browse", "purge"]})
    before = acl.describe(ORDERS)
    with pytest.raises(AccessDenied, match="only its owner 'alice'"):
        acl.grant(BOB, ORDERS, "user:bob", ["manage"])
    with pytest.raises(AccessDenied):
        acl.revoke(CAROL, ORDERS, "user:bob", ["consume"])
    assert acl.describe(ORDERS) == before
    acl.revoke(ALICE, ORDERS, "user:bob", ["consume"])
    assert not may(acl, BOB, ORDERS, "consume") and may(acl, BOB, ORDERS, "produce")


def test_a_grant_of_nothing_lets_a_user_neither_see_nor_use_the_queue():
    acl = control({})
    acl.own(ORDERS, "alice", {"user:bob": []})
    assert not acl.sees(BOB, ORDERS)
    with pytest.raises(AccessDenied):
        acl.check_sees(BOB, ORDERS)
    assert not any(may(acl, BOB, ORDERS, p) for p in PERMISSIONS)
    acl.grant(ALICE, ORDERS, "user:bob", ["browse"])
    assert acl.sees(BOB, ORDERS)


@pytest.mark.parametrize("principal", ["user:", "role:", "", "user", "bob", ":bob", "users:bob"])
def test_a_malformed_principal_is_refused_wherever_it_is_given(principal):
    with pytest.raises(ConfigError, match="principal"):
        AccessControl({principal: ["consume"]})
    acl = control({})
    acl.own(ORDERS, "alice")
    before = acl.describe(ORDERS)
    for change in (acl.grant, acl.revoke):
        with pytest.raises(ConfigError, match="principal"):
            change(ALICE, ORDERS, principal, ["consume"])
    with pytest.raises(ConfigError, match="principal"):
        acl.own("/queue/other", "alice", {principal: ["consume"]})
    assert acl.describe(ORDERS) == before and "/queue/other" not in acl.acls


@pytest.mark.parametrize("permissions", [["fly"], ["consume", "Consume"], ["admin"]])
def test_an_unknown_permission_is_refused_wherever_it_is_given(permissions):
    with pytest.raises(ConfigError, match="unknown permission"):
        AccessControl({"*": permissions})
    acl = control({})
    acl.own(ORDERS, "alice")
    before = acl.describe(ORDERS)
    with pytest.raises(ConfigError, match="unknown permission"):
        acl.grant(ALICE, ORDERS, "user:bob", permissions)
    with pytest.raises(ConfigError, match="unknown permission"):
        acl.checked_grants({"user:bob": permissions})
    assert acl.describe(ORDERS) == before


# -- destinations nobody owns -----------------------------------------------------------------------------------
def test_a_destination_nobody_owns_follows_the_defaults():
    acl = control({"user:bob": ["consume"]})
    assert may(acl, BOB, "/queue/anything", "consume") and not may(acl, BOB, "/queue/anything", "produce")
    assert not may(acl, CAROL, "/queue/anything", "consume")
    assert acl.sees(BOB, "/queue/anything") and not acl.sees(CAROL, "/queue/anything")
    opened = control()
    assert all(may(opened, ANONYMOUS, "/queue/anything", p) for p in OPEN_DEFAULTS)
    assert not may(opened, ANONYMOUS, "/queue/anything", "manage")


def test_a_first_grant_keeps_everyones_access_but_not_the_right_to_claim_the_queue():
    """An administrator's first grant on a queue nobody owns starts from the defaults (nobody loses
    access), except ``create``: the right to make new queues must not become a right to take this one."""
    acl = control()                                     # '*' may create, produce, consume, browse, purge
    assert claims(acl, CAROL, "/queue/shared", exists=False)          # a new name: create from the defaults
    assert not claims(acl, CAROL, "/queue/shared", exists=True)       # an existing one: not through defaults
    acl.grant(ROOT, "/queue/shared", "user:bob", ["create"])
    assert may(acl, CAROL, "/queue/shared", "consume") and may(acl, CAROL, "/queue/shared", "produce")
    assert not claims(acl, CAROL, "/queue/shared", exists=True)
    assert claims(acl, BOB, "/queue/shared", exists=True)             # the grant on that queue itself


# -- temporary destinations -------------------------------------------------------------------------------------
@pytest.mark.parametrize("destination", ["/temp-queue/tmp.c1.reply", "/temp-topic/tmp.c1.news"])
def test_anyone_may_send_to_a_temporary_destination_whatever_the_defaults(destination):
    """Replies: a temporary destination is open to every sender (its reader is checked where it is handed
    out); the same name as an ordinary one follows the defaults."""
    acl = control({})
    assert may(acl, BOB, destination, "produce") and may(acl, ANONYMOUS, destination, "produce")
    assert not may(acl, BOB, destination.replace("/temp-", "/"), "produce")


# -- system-owned destinations: dead letters, expiry -------------------------------------------------------------
def test_a_dead_letter_queue_lets_its_source_readers_consume_browse_and_purge_and_nothing_else():
    acl = control({})
    acl.own(ORDERS, "alice", {"user:bob": ["consume", "browse", "purge", "produce"]})
    for permission in ("consume", "browse", "purge"):
        assert may(acl, BOB, DLQ, permission), permission
        assert may(acl, ALICE, DLQ, permission), permission           # the owner's 'everything', read here
    for permission in ("produce", "create", "manage"):
        assert not may(acl, BOB, DLQ, permission), permission
        assert not may(acl, ALICE, DLQ, permission), permission
    assert not may(acl, CAROL, DLQ, "consume") and not acl.sees(CAROL, DLQ)
    assert acl.sees(BOB, DLQ)
    acl.revoke(ALICE, ORDERS, "user:bob", ["consume", "browse", "purge"])     # read at every check
    assert not may(acl, BOB, DLQ, "consume") and not acl.sees(BOB, DLQ)


def test_only_the_administrator_declares_claims_drops_or_grants_on_a_system_owned_queue():
    acl = control()                                     # open defaults: everyone may create new queues
    acl.own(ORDERS, "alice", {"user:bob": ["manage"]})
    for queue in (DLQ, EXPIRY):
        for user in (ALICE, BOB, CAROL):
            assert not claims(acl, user, queue, exists=False), (user.name, queue)
            assert not claims(acl, user, queue, exists=True), (user.name, queue)
            with pytest.raises(AccessDenied, match="system-owned"):
                acl.check_manage(user, queue, "drop")
            with pytest.raises(AccessDenied):
                acl.grant(user, queue, "user:bob", ["consume"])
        assert claims(acl, ROOT, queue, exists=True)


def test_an_administrators_grant_on_a_dead_letter_queue_is_exactly_that_grant():
    """No ``manage`` implying the rest, no ``create`` letting a user declare or claim it: only the
    permission granted, and only the inherited kinds or ``produce``."""
    acl = control({})
    acl.own(ORDERS, "alice")
    acl.grant(ROOT, DLQ, "user:bob", ["manage", "create"])
    for permission in PERMISSIONS:
        assert not may(acl, BOB, DLQ, permission), permission
    assert not claims(acl, BOB, DLQ, exists=False) and not claims(acl, BOB, DLQ, exists=True)
    assert acl.sees(BOB, DLQ)                           # he holds something on it: it is in his lists
    acl.grant(ROOT, DLQ, "user:bob", ["produce", "consume"])
    assert may(acl, BOB, DLQ, "produce") and may(acl, BOB, DLQ, "consume")
    assert not may(acl, BOB, DLQ, "browse")


def test_the_expiry_queue_is_the_administrators_alone():
    acl = control()
    assert not any(may(acl, user, EXPIRY, p) for user in (ALICE, BOB, ANONYMOUS) for p in PERMISSIONS)
    assert not acl.sees(BOB, EXPIRY) and acl.sees(ROOT, EXPIRY)


# -- topic patterns ---------------------------------------------------------------------------------------------
def test_a_grant_on_a_topic_pattern_covers_exactly_what_it_matches():
    acl = control({})
    acl.grant(ROOT, "/topic/stocks.*", "user:bob", ["consume"])
    assert may(acl, BOB, "/topic/stocks.ibm", "consume") and may(acl, BOB, "/topic/stocks.*", "consume")
    assert not may(acl, BOB, "/topic/stocks.#", "consume") and not may(acl, BOB, "/topic/#", "consume")
    assert not may(acl, BOB, "/topic/stocks.ibm", "produce") and not may(acl, CAROL, "/topic/stocks.ibm", "consume")
    assert acl.sees(BOB, "/topic/stocks.ibm") and not acl.sees(CAROL, "/topic/stocks.ibm")
