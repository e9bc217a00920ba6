"""Engine, sessions and the declarative base.

SQLite (the embedded default) runs in WAL mode with a busy timeout; a session
that writes starts with ``BEGIN IMMEDIATE`` so writers queue for the one write
lock at the start of their transaction instead of failing half-way through.
Reads start a plain deferred transaction and never wait for writers.
PostgreSQL uses row locks (``FOR UPDATE``, ``SKIP LOCKED``) where work is shared.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, TypeVar

from fastapi import Depends, Request
from sqlalchemy import JSON, BigInteger, Connection, DateTime, Engine, Integer, MetaData, create_engine, event
from sqlalchemy import Enum as EnumType
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.pool import NullPool
from sqlalchemy.types import TypeDecorator

from service.config import Settings

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Integer primary keys that are BIGINT on PostgreSQL and INTEGER (the rowid alias) on SQLite.
BigId = BigInteger().with_variant(Integer(), "sqlite")
# Table option of every table: SQLite's AUTOINCREMENT, so that an id is never handed out twice (without
# it SQLite reuses the ids of deleted newest rows; task ids are attempt ids). PostgreSQL ignores it.
NEVER_REUSE_IDS = {"sqlite_autoincrement": True}


# Most values one IN list binds. A statement has a bound on its parameters (psycopg: 65,535; SQLite
# before 3.32: 999), so a list that grows with the data is sent in chunks of this size.
IN_LIST_CHUNK = 900

Value = TypeVar("Value", int, str)


def in_chunks(values: Iterable[Value], size: int = IN_LIST_CHUNK) -> Iterator[list[Value]]:
    """``values`` sorted and cut into lists of at most ``size``: rows locked chunk after chunk stay in order."""
    ordered = sorted(set(values))
    for start in range(0, len(ordered), size):
        yield ordered[start : start + size]


def system_clock() -> datetime:
    return datetime.now(UTC)


# The service's one source of "now" (leases, reaping, timestamps). Tests move time by replacing it
# (the ``clock`` fixture of tests/api); nothing else assigns it.
clock: Callable[[], datetime] = system_clock


def utcnow() -> datetime:
    return clock()


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC datetimes on every database (SQLite keeps no zone of its own)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the database; use service.db.utcnow()")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def state_type(states: type[StrEnum]) -> EnumType:
    """A state column's type: the enum's values in a VARCHAR(16) (the schema's type), no CHECK constraint."""
    return EnumType(
        states,
        native_enum=False,
        create_constraint=False,
        validate_strings=True,
        length=16,
        values_callable=lambda members: [member.value for member in members],
    )


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: UTCDateTime(), dict[str, Any]: JSON()}


def make_engine(url: str, settings: Settings | None = None, *, pool: bool = True) -> Engine:
    """An engine for ``url`` with the pragmas and pool this service relies on."""
    settings = settings or Settings()
    # Both databases get the same pool: db_pool_size connections plus as many overflow, so that the
    # admission control's default of db_pool_size permits is half the pool on either (service/admission.py).
    kwargs: dict[str, Any] = (
        {"pool_size": settings.db_pool_size, "max_overflow": settings.db_pool_size} if pool else {"poolclass": NullPool}
    )
    if url.startswith("sqlite"):
        engine = create_engine(
            url, connect_args={"timeout": settings.sqlite_busy_timeout_ms / 1000, "check_same_thread": False}, **kwargs
        )
        _configure_sqlite(engine, settings.sqlite_busy_timeout_ms)
        return engine
    if not pool:
        return create_engine(url, **kwargs)
    engine = create_engine(url, **kwargs)
    _ping_when_idle(engine, PING_AFTER_IDLE_S)
    return engine


# A pooled connection is pinged before use only when it has been idle this long (seconds).
PING_AFTER_IDLE_S = 1.0
_monotonic = time.monotonic  # the pool's clock (a test moves it)


def _ping_when_idle(engine: Engine, idle_s: float) -> None:
    """Ping a connection at checkout if it lay in the pool more than ``idle_s`` s; replace it if dead.

    SQLAlchemy's ``pool_pre_ping`` pings at every checkout: a round trip to the database on every
    request, a quarter of a status read's. A connection in steady use is alive (it was used under a
    second ago); one that waited through a database restart is caught here, as pre-ping would, and a
    dead one is replaced before the request sees it. (A restart inside that second, like one between
    a ping and the query, fails that request with 503 ``database_unavailable``; SQLAlchemy then
    replaces the pool's older connections.)
    """

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = _monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is None or _monotonic() - idle_since <= idle_s:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except Exception as error:
            raise DisconnectionError(f"idle connection failed its ping: {type(error).__name__}") from error
        if not alive:
            raise DisconnectionError("idle connection failed its ping")


def _configure_sqlite(engine: Engine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from the sqlite3 module: SQLAlchemy's "begin" event emits BEGIN.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        mode = "IMMEDIATE" if connection.get_execution_options().get("sqlite_write") else "DEFERRED"
        connection.exec_driver_sql(f"BEGIN {mode}")


class Database:
    """The engine and the two session factories of one service process."""

    def __init__(self, url: str, settings: Settings | None = None, *, pool: bool = True):
        self.url = url
        self.engine = make_engine(url, settings, pool=pool)
        self.dialect = self.engine.dialect.name
        writer = self.engine.execution_options(sqlite_write=True) if self.dialect == "sqlite" else self.engine
        # PostgreSQL reads run in autocommit: no BEGIN and no ROLLBACK, two round trips fewer per read.
        # Nothing is lost: at READ COMMITTED (the default) each statement takes its own snapshot inside a
        # transaction too, and a read session never writes.
        reader = (
            self.engine.execution_options(isolation_level="AUTOCOMMIT") if self.dialect == "postgresql" else self.engine
        )
        self._reader = reader
        self._write_sessions = sessionmaker(writer, expire_on_commit=False)
        self._read_sessions = sessionmaker(reader, expire_on_commit=False)

    @contextmanager
    def session(self, *, write: bool = True) -> Iterator[Session]:
        factory = self._write_sessions if write else self._read_sessions
        with factory() as session:
            yield session

    @contextmanager
    def read_connection(self) -> Iterator[Connection]:
        """A pooled connection for Core statements that only read (PostgreSQL: autocommit, as the readers'
        ORM work), without the ORM's unit of work around it: the polled reads' path."""
        with self._reader.connect() as connection:
            yield connection

    def dispose(self) -> None:
        self.engine.dispose()


def is_postgresql(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def get_database(request: Request) -> Database:
    return request.app.state.database


async def get_app_settings(request: Request) -> Settings:
    # async: no I/O, and a sync dependency costs a turn through the thread pool
    return request.app.state.settings


def get_session(request: Request) -> Iterator[Session]:
    """A session for a request that writes (on SQLite: BEGIN IMMEDIATE)."""
    with get_database(request).session(write=True) as session:
        yield session


def get_read_session(request: Request) -> Iterator[Session]:
    """A session for a request that only reads."""
    with get_database(request).session(write=False) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]
ReadSessionDep = Annotated[Session, Depends(get_read_session)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
