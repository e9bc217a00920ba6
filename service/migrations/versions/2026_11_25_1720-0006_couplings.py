"""The bandpowers' mode couplings a site's realisations built and read: ``couplings`` and ``coupling_campaigns``.

One row per (site, coupling key), written when a realisation's result that used the coupling file is
accepted: the file's checksum and size, the build time, the number of accepted results that used it;
``coupling_campaigns`` names the campaigns those results belong to.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 17:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.db

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "couplings",
        sa.Column("id", _ID, nullable=False),
        sa.Column("coupling_key", sa.String(length=64), nullable=False),
        sa.Column("site", sa.String(length=128), nullable=False),
        sa.Column("scan_key", sa.String(length=64), nullable=False),
        sa.Column("mask_sha256", sa.String(length=64), nullable=False),
        sa.Column("file_sha256", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("build_time_s", sa.Float(), nullable=True),
        sa.Column("built_at", service.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("uses", sa.Integer(), nullable=False),
        sa.Column("created_at", service.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", service.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_couplings")),
        sa.UniqueConstraint("site", "coupling_key", name=op.f("uq_couplings_site_coupling_key")),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("couplings", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_couplings_scan_key"), ["scan_key"], unique=False)
    op.create_table(
        "coupling_campaigns",
        sa.Column("coupling_id", _ID, nullable=False),
        sa.Column("campaign_id", _ID, nullable=False),
        sa.ForeignKeyConstraint(
            ["coupling_id"], ["couplings.id"], name=op.f("fk_coupling_campaigns_coupling_id_couplings"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["campaign_id"], ["campaigns.id"], name=op.f("fk_coupling_campaigns_campaign_id_campaigns"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("coupling_id", "campaign_id", name=op.f("pk_coupling_campaigns")),
    )
    with op.batch_alter_table("coupling_campaigns", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_coupling_campaigns_campaign_id"), ["campaign_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("coupling_campaigns", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_coupling_campaigns_campaign_id"))
    op.drop_table("coupling_campaigns")
    with op.batch_alter_table("couplings", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_couplings_scan_key"))
    op.drop_table("couplings")
