"""SelectionRule and RuleBook: validation, YAML, run-time changes, versions, thread safety."""
from __future__ import annotations

import threading

import pytest

from pymq.errors import ConfigError, InvalidSelector
from pymq_server.storage.selection import RuleBook, SelectionRule

SEED_YAML = """
rules:
  - id: W001
    device: HDD
    weight: 31
    condition: SIZE > 10 AND SIZE < 100 AND TYPE == TEXT
  - {id: W002, device: HDD, weight: 60, condition: TYPE == BYTE}
  - id: W003
    device: MEMORY
    weight: 80
    condition: DESTINATION == QUEUE AND HEADER("asd").isPresent()
  - {id: W004, device: MEMORY, weight: 90, condition: 'CLIENT_ID == "privileged"'}
  - {id: W005, device: MEMORY, weight: 80, condition: SIZE < 20}
  - {id: W006, device: DB1, weight: 60, condition: 'HEADER("locator").contains("fast db")'}
  - {id: W007, device: DB2, weight: 60, condition: 'HEADER("locator").contains("slow db")'}
  - {id: W999, device: GRID, weight: 90, condition: SIZE > 10000}
"""


def test_rule_compiles_its_condition():
    rule = SelectionRule("W005", "MEMORY", 80, "SIZE < 20")
    assert rule.compiled.identifiers == {"size_bytes"}
    assert rule.compiled.matches({"size_bytes": 1024})


@pytest.mark.parametrize("kwargs, what", [
    (dict(id="", device="m", weight=1, condition=""), "id"),
    (dict(id="x", device="", weight=1, condition=""), "device"),
    (dict(id="x", device="m", weight="high", condition=""), "weight"),
    (dict(id="x", device="m", weight=True, condition=""), "weight"),
    (dict(id="x", device="m", weight=float("nan"), condition=""), "weight"),
    (dict(id="x", device="m", weight=1, condition=5), "condition"),
])
def test_rule_validation(kwargs, what):
    with pytest.raises(ConfigError, match=what):
        SelectionRule(**kwargs)


def test_bad_condition_names_the_rule_and_keeps_the_position():
    with pytest.raises(InvalidSelector) as info:
        SelectionRule("W010", "HDD", 10, "SIZE > 10 AND colour = 'red'")
    assert info.value.position == 14
    assert str(info.value).startswith("rule W010: storage rule error at position 14: expected a storage-rule keyword")


def test_yaml_round_trip():
    book = RuleBook.from_yaml(SEED_YAML)
    assert [r.id for r in book] == ["W001", "W002", "W003", "W004", "W005", "W006", "W007", "W999"]
    assert book.get("W004").condition == 'CLIENT_ID == "privileged"'
    again = RuleBook.from_yaml(book.to_yaml())
    assert [r.to_mapping() for r in again] == [r.to_mapping() for r in book]


def test_yaml_bare_list_and_empty():
    assert len(RuleBook.from_yaml("- {id: a, device: m, weight: 1, condition: ''}")) == 1
    assert len(RuleBook.from_yaml("")) == 0
    assert len(RuleBook.from_yaml("rules:")) == 0
    # a null condition is the catch-all empty condition
    assert RuleBook.from_yaml("- {id: a, device: m, weight: 1, condition: }").get("a").compiled.selects_all


@pytest.mark.parametrize("text, match", [
    ("rules: [{id: a, device: m, weight: 1}]", "missing keys"),
    ("rules: [{id: a, device: m, weight: 1, condition: '', colour: red}]", "unknown keys"),
    ("rules: {id: a}", "must be a list"),
    ("rules: [5]", "must be a mapping"),
    ("rules: [{id: a, device: m, weight: 1, condition: ''}, {id: a, device: n, weight: 2, condition: ''}]",
     "two storage rules"),
    ("rules: [ {id: a", "not valid YAML"),
])
def test_yaml_errors(text, match):
    with pytest.raises(ConfigError, match=match):
        RuleBook.from_yaml(text)


def test_known_devices_are_enforced():
    with pytest.raises(ConfigError, match="unknown device 'SSD'"):
        RuleBook.from_yaml("- {id: a, device: SSD, weight: 1, condition: ''}", known_devices=["HDD"])
    book = RuleBook(known_devices=["HDD"])
    with pytest.raises(ConfigError, match="unknown device"):
        book.add(SelectionRule("a", "SSD", 1, ""))


def test_add_replace_remove_bump_the_version():
    book = RuleBook.from_yaml(SEED_YAML)
    v0 = book.version
    book.add(SelectionRule("W010", "HDD", 5, "TYPE == MAP"))
    assert book.version == v0 + 1 and "W010" in book
    old = book.replace(SelectionRule("W002", "HDD", 70, "TYPE == BYTE"))
    assert old.weight == 60 and book.get("W002").weight == 70
    assert [r.id for r in book].index("W002") == 1          # replace keeps the rule's place
    assert book.remove("W010").id == "W010" and "W010" not in book
    assert book.version == v0 + 3


def test_change_errors_leave_the_book_untouched():
    book = RuleBook.from_yaml(SEED_YAML)
    v, rules = book.snapshot
    with pytest.raises(ConfigError, match="already exists"):
        book.add(SelectionRule("W001", "HDD", 1, ""))
    with pytest.raises(ConfigError, match="to replace"):
        book.replace(SelectionRule("nope", "HDD", 1, ""))
    with pytest.raises(ConfigError, match="to remove"):
        book.remove("nope")
    with pytest.raises(ConfigError):
        book.load([SelectionRule("a", "m", 1, ""), SelectionRule("a", "m", 2, "")])
    assert book.snapshot == (v, rules)


def test_snapshot_taken_before_a_change_is_unaffected():
    book = RuleBook.from_yaml(SEED_YAML)
    version, rules = book.snapshot
    book.remove("W001")
    assert [r.id for r in rules][0] == "W001" and version == book.version - 1


def test_concurrent_changes_are_all_applied():
    book = RuleBook()
    n_threads, per_thread = 4, 50

    def worker(t):
        for i in range(per_thread):
            book.add(SelectionRule(f"t{t}-{i}", "m", i, "SIZE > 1"))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(book) == n_threads * per_thread
    assert book.version == n_threads * per_thread
    assert len({r.id for r in book.rules}) == n_threads * per_thread


def test_to_yaml_quotes_awkward_conditions():
    awkward = ["!HEADER('x').isPresent()", "HEADER('a') = 'x: y #z'", "'TEXT' = TYPE", "&& TYPE = TEXT"[3:],
               '"QUEUE" == DESTINATION', "* SIZE > 1"[2:], ""]
    book = RuleBook(SelectionRule(f"r{i}", "m", i, c) for i, c in enumerate(awkward))
    again = RuleBook.from_yaml(book.to_yaml())
    assert [r.condition for r in again] == awkward
