"""Who uploaded which instrument file: ``instrument_uploads``.

One row per (user, file checksum): the file's kind, size and detectors or scans, and when it was
uploaded. A user's quota counts these rows; a delete removes the user's row, and the file itself
when no row names it any more. Files uploaded before this revision have no row: nobody's quota
counts them and no user can delete them (the operator can).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27 22:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.db

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "instrument_uploads",
        sa.Column("id", _ID, nullable=False),
        sa.Column("owner_id", _ID, nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("entries", sa.Integer(), nullable=False),
        sa.Column("created_at", service.db.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.id"], name=op.f("fk_instrument_uploads_owner_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instrument_uploads")),
        sa.UniqueConstraint("owner_id", "sha256", name=op.f("uq_instrument_uploads_owner_id_sha256")),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("instrument_uploads", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_instrument_uploads_sha256"), ["sha256"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("instrument_uploads", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_instrument_uploads_sha256"))
    op.drop_table("instrument_uploads")
