"""Groups of real ``pymq-server`` processes over one store (tests/ha/members.py): a shared data directory, or
a PostgreSQL database (its own table prefix per test, dropped afterwards)."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.ha.members import Member, ha_config
from tests.storage.services import postgres_url  # noqa: F401 - a fixture


class Group:
    def __init__(self, root: Path, store: str, url: str | None) -> None:
        self.root = root
        self.store = store
        self.url = url
        self.prefix = "h" + uuid.uuid4().hex[:10] + "_"
        self.data_dir = root / "shared"
        self.members: list[Member] = []
        self._n = 0

    def config(self, **options) -> Path:
        self._n += 1
        path = self.root / f"member-{self._n}.yaml"
        return ha_config(path, postgres_url=self.url if self.store == "postgresql" else None,
                         table_prefix=self.prefix, **options)

    def start(self, name: str, *args: str, **options) -> Member:
        member = Member(name, self.data_dir if self.store == "file" else self.root / name, self.config(**options),
                        *args)
        self.members.append(member)
        return member

    def rows(self) -> dict[str, list]:
        """The SQL store's rows (the PostgreSQL group's "files"), every table but the lease's."""
        import sqlalchemy as sa
        engine = sa.create_engine(self.url)
        out = {}
        try:
            with engine.connect() as conn:
                for table in ("message", "reference", "catalog", "pending"):
                    out[table] = sorted(tuple(map(repr, row)) for row in conn.execute(
                        sa.text(f"SELECT * FROM {self.prefix}{table}")))
        finally:
            engine.dispose()
        return out

    def state(self) -> dict:
        """What a former live must not change: the store's files (but the lease's), or its rows."""
        from tests.ha.members import store_digest
        return store_digest(self.data_dir) if self.store == "file" else self.rows()

    def close(self) -> None:
        for member in self.members:
            if member.exited() is None:
                member.kill()
        if self.store == "postgresql":
            import sqlalchemy as sa
            engine = sa.create_engine(self.url)
            with engine.begin() as conn:
                for table in ("ha", "message", "reference", "catalog", "pending"):
                    conn.execute(sa.text(f"DROP TABLE IF EXISTS {self.prefix}{table}"))
            engine.dispose()


@pytest.fixture(params=["file", "postgresql"])
def group(request, tmp_path):
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else None
    made = Group(tmp_path, request.param, url)
    yield made
    made.close()


@pytest.fixture
def file_group(tmp_path):
    made = Group(tmp_path, "file", None)
    yield made
    made.close()
