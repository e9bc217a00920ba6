"""What a campaign's focal-plane and schedule files said at submit: ``campaigns.instrument_summary``.

The dashboard draws a file-based focal plane and lists a schedule's scans from it, without reading the
files again (the service reads them once, at submit, to check them).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27 03:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("campaigns") as batch:
        batch.add_column(sa.Column("instrument_summary", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("campaigns") as batch:
        batch.drop_column("instrument_summary")
