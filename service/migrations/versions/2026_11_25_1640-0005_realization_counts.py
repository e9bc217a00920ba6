"""Realisation counts per campaign and state, kept by the database; an index for recent finishes; a worker's
site data folder.

A campaign's status read counted its realisations by state (``GROUP BY`` over all its rows:
1.5 ms for 10,000, growing with the campaign); the dashboard and every status refresh paid it.
``realization_counts`` holds those counts, kept current by triggers on ``realizations`` in the
same transaction as the change, whatever code path makes it (claims, reports, the reaper, cancel,
retry, delete). PostgreSQL: statement-level triggers over the transition tables, so a bulk change
of 100,000 rows updates each (campaign, state) row once; SQLite: row-level triggers (one writer
at a time, so no lock order to keep).

``ix_realizations_campaign_id_finished_at`` serves the throughput figure (realisations finished in
the last hour), which otherwise read every finished row of the campaign.

``workers.data_dir``: the site's data folder a worker registered with; the plan paths it reports built
must lie inside it.

A later migration that recreates ``realizations`` on SQLite (Alembic batch mode) drops its
triggers, and has to create them again (:func:`create_sqlite_triggers`).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 15:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Rows are written in (campaign_id, state) order, so two statements changing the same campaigns take
# the rows' locks in one order.
_PG_FUNCTIONS = {
    "insert": """
        INSERT INTO realization_counts (campaign_id, state, count)
        SELECT campaign_id, state, count(*) FROM new_rows GROUP BY campaign_id, state ORDER BY campaign_id, state
        ON CONFLICT (campaign_id, state) DO UPDATE SET count = realization_counts.count + EXCLUDED.count;
    """,
    "update": """
        INSERT INTO realization_counts (campaign_id, state, count)
        SELECT campaign_id, state, sum(delta) FROM (
            SELECT campaign_id, state, count(*) AS delta FROM new_rows GROUP BY campaign_id, state
            UNION ALL
            SELECT campaign_id, state, -count(*) AS delta FROM old_rows GROUP BY campaign_id, state
        ) AS changes
        GROUP BY campaign_id, state HAVING sum(delta) <> 0 ORDER BY campaign_id, state
        ON CONFLICT (campaign_id, state) DO UPDATE SET count = realization_counts.count + EXCLUDED.count;
    """,
    # No insert on delete: the campaign's rows may be going in the same statement (ON DELETE CASCADE).
    "delete": """
        UPDATE realization_counts SET count = realization_counts.count - gone.n
        FROM (SELECT campaign_id, state, count(*) AS n FROM old_rows GROUP BY campaign_id, state) AS gone
        WHERE realization_counts.campaign_id = gone.campaign_id AND realization_counts.state = gone.state;
    """,
}
_PG_TRANSITION_TABLES = {
    "insert": "NEW TABLE AS new_rows",
    "update": "OLD TABLE AS old_rows NEW TABLE AS new_rows",
    "delete": "OLD TABLE AS old_rows",
}

_SQLITE_TRIGGERS = {
    "insert": """
        CREATE TRIGGER realization_counts_insert AFTER INSERT ON realizations BEGIN
            INSERT INTO realization_counts (campaign_id, state, count) VALUES (NEW.campaign_id, NEW.state, 1)
            ON CONFLICT (campaign_id, state) DO UPDATE SET count = count + 1;
        END
    """,
    "update": """
        CREATE TRIGGER realization_counts_update AFTER UPDATE OF state, campaign_id ON realizations
        WHEN OLD.state IS NOT NEW.state OR OLD.campaign_id IS NOT NEW.campaign_id BEGIN
            UPDATE realization_counts SET count = count - 1 WHERE campaign_id = OLD.campaign_id AND state = OLD.state;
            INSERT INTO realization_counts (campaign_id, state, count) VALUES (NEW.campaign_id, NEW.state, 1)
            ON CONFLICT (campaign_id, state) DO UPDATE SET count = count + 1;
        END
    """,
    "delete": """
        CREATE TRIGGER realization_counts_delete AFTER DELETE ON realizations BEGIN
            UPDATE realization_counts SET count = count - 1 WHERE campaign_id = OLD.campaign_id AND state = OLD.state;
        END
    """,
}


def create_sqlite_triggers() -> None:
    for sql in _SQLITE_TRIGGERS.values():
        op.execute(sql)


def upgrade() -> None:
    op.create_table(
        "realization_counts",
        sa.Column("campaign_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["campaign_id"],
            ["campaigns.id"],
            name=op.f("fk_realization_counts_campaign_id_campaigns"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("campaign_id", "state", name=op.f("pk_realization_counts")),
    )
    op.execute(
        "INSERT INTO realization_counts (campaign_id, state, count) "
        "SELECT campaign_id, state, count(*) FROM realizations GROUP BY campaign_id, state"
    )
    op.create_index("ix_realizations_campaign_id_finished_at", "realizations", ["campaign_id", "finished_at"])
    op.add_column("workers", sa.Column("data_dir", sa.String(length=4096), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        for operation, body in _PG_FUNCTIONS.items():
            op.execute(
                f"CREATE FUNCTION realization_counts_{operation}() RETURNS trigger LANGUAGE plpgsql AS $$ "
                f"BEGIN {body} RETURN NULL; END $$"
            )
            op.execute(
                f"CREATE TRIGGER realization_counts_{operation} AFTER {operation.upper()} ON realizations "
                f"REFERENCING {_PG_TRANSITION_TABLES[operation]} FOR EACH STATEMENT "
                f"EXECUTE FUNCTION realization_counts_{operation}()"
            )
    else:
        create_sqlite_triggers()


def downgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    for operation in _PG_FUNCTIONS:
        op.execute(f"DROP TRIGGER IF EXISTS realization_counts_{operation}{' ON realizations' if postgresql else ''}")
        if postgresql:
            op.execute(f"DROP FUNCTION IF EXISTS realization_counts_{operation}()")
    with op.batch_alter_table("workers") as batch_op:
        batch_op.drop_column("data_dir")
    op.drop_index("ix_realizations_campaign_id_finished_at", table_name="realizations")
    op.drop_table("realization_counts")
