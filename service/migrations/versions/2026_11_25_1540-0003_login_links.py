"""One-time dashboard login links (``mapcampaign up`` prints one): the table ``login_links``.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25 15:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.db

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "login_links",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("token_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", service.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", service.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("used_at", service.db.UTCDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["token_id"], ["api_tokens.id"], name=op.f("fk_login_links_token_id_api_tokens"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_login_links")),
        sa.UniqueConstraint("secret_hash", name=op.f("uq_login_links_secret_hash")),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("login_links", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_login_links_token_id"), ["token_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("login_links", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_login_links_token_id"))
    op.drop_table("login_links")
