"""Initial schema: users, tokens, campaigns, realisations, attempts, plans, workers, events.

Revision ID: 0001
Revises:
Create Date: 2026-11-21 17:37:42.288886
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.db

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=True),
        sa.Column("owner_id", sa.BigInteger(), nullable=True),
        sa.Column("campaign_id", sa.BigInteger(), nullable=True),
        sa.Column("realization", sa.Integer(), nullable=True),
        sa.Column("plan_id", sa.BigInteger(), nullable=True),
        sa.Column("created_at", service.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index("ix_events_campaign_id_id", ["campaign_id", "id"], unique=False)
        batch_op.create_index("ix_events_kind_state", ["kind", "state"], unique=False)

    op.create_table(
        "users",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("created_at", service.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("name", name=op.f("uq_users_name")),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("user_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("label", sa.String(length=200), nullable=False),
        sa.Column("created_at", service.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", service.db.UTCDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_api_tokens_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
    )
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_tokens_user_id"), ["user_id"], unique=False)

    op.create_table(
        "campaigns",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("owner_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("realizations", sa.Integer(), nullable=False),
        sa.Column("ranks", sa.Integer(), nullable=False),
        sa.Column("scan_key", sa.String(length=64), nullable=False),
        sa.Column("spec_hash", sa.String(length=64), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("created_at", service.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("queued_at", service.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("finished_at", service.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("cancel_reason", sa.Text(), nullable=True),
        sa.Column("failure_cause", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.id"], name=op.f("fk_campaigns_owner_id_users"), ondelete="RESTRICT"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_campaigns")),
        sa.UniqueConstraint("owner_id", "idempotency_key", name=op.f("uq_campaigns_owner_id_idempotency_key")),
    )
    with op.batch_alter_table("campaigns", schema=None) as batch_op:
        batch_op.create_index("ix_campaigns_owner_id_id", ["owner_id", "id"], unique=False)
        batch_op.create_index(batch_op.f("ix_campaigns_scan_key"), ["scan_key"], unique=False)
        batch_op.create_index("ix_campaigns_state_priority", ["state", "priority"], unique=False)

    op.create_table(
        "workers",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("site", sa.String(length=128), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("capacity", sa.Integer(), nullable=False),
        sa.Column("token_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("registered_at", service.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("last_heartbeat_at", service.db.UTCDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["token_id"], ["api_tokens.id"], name=op.f("fk_workers_token_id_api_tokens"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workers")),
        sa.UniqueConstraint("name", name=op.f("uq_workers_name")),
    )
    op.create_table(
        "preprocessing_plans",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("scan_key", sa.String(length=64), nullable=False),
        sa.Column("ranks", sa.Integer(), nullable=False),
        sa.Column("site", sa.String(length=128), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("checksum", sa.String(length=200), nullable=True),
        sa.Column("build_time_s", sa.Float(), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("uses", sa.Integer(), nullable=False),
        sa.Column("build_attempts", sa.Integer(), nullable=False),
        sa.Column("build_number", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("campaign_id", sa.BigInteger(), nullable=True),
        sa.Column("lease_holder_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("lease_expires_at", service.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("created_at", service.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("ready_at", service.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("failed_at", service.db.UTCDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["lease_holder_id"],
            ["workers.id"],
            name=op.f("fk_preprocessing_plans_lease_holder_id_workers"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_preprocessing_plans")),
        sa.UniqueConstraint("scan_key", "ranks", "site", name=op.f("uq_preprocessing_plans_scan_key_ranks_site")),
    )
    op.create_table(
        "realizations",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("campaign_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("attempts_total", sa.Integer(), nullable=False),
        sa.Column("current_attempt_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("lease_holder_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("lease_expires_at", service.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("finished_at", service.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("updated_at", service.db.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["campaign_id"], ["campaigns.id"], name=op.f("fk_realizations_campaign_id_campaigns"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["lease_holder_id"],
            ["workers.id"],
            name=op.f("fk_realizations_lease_holder_id_workers"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_realizations")),
        sa.UniqueConstraint("campaign_id", "index", name=op.f("uq_realizations_campaign_id_index")),
    )
    with op.batch_alter_table("realizations", schema=None) as batch_op:
        batch_op.create_index(
            "ix_realizations_campaign_id_state_index", ["campaign_id", "state", "index"], unique=False
        )
        batch_op.create_index("ix_realizations_state_lease_expires_at", ["state", "lease_expires_at"], unique=False)

    op.create_table(
        "attempts",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("realization_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("campaign_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("plan_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("worker_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("host", sa.String(length=255), nullable=True),
        sa.Column("scheduler_job_id", sa.String(length=255), nullable=True),
        sa.Column("claimed_at", service.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("started_at", service.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("ended_at", service.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("failure_class", sa.String(length=32), nullable=True),
        sa.Column("log_tail", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["campaign_id"], ["campaigns.id"], name=op.f("fk_attempts_campaign_id_campaigns"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["plan_id"],
            ["preprocessing_plans.id"],
            name=op.f("fk_attempts_plan_id_preprocessing_plans"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["realization_id"],
            ["realizations.id"],
            name=op.f("fk_attempts_realization_id_realizations"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["worker_id"], ["workers.id"], name=op.f("fk_attempts_worker_id_workers"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempts")),
    )
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_attempts_campaign_id"), ["campaign_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_attempts_failure_class"), ["failure_class"], unique=False)
        batch_op.create_index("ix_attempts_realization_id_number", ["realization_id", "number"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_index("ix_attempts_realization_id_number")
        batch_op.drop_index(batch_op.f("ix_attempts_failure_class"))
        batch_op.drop_index(batch_op.f("ix_attempts_campaign_id"))

    op.drop_table("attempts")
    with op.batch_alter_table("realizations", schema=None) as batch_op:
        batch_op.drop_index("ix_realizations_state_lease_expires_at")
        batch_op.drop_index("ix_realizations_campaign_id_state_index")

    op.drop_table("realizations")
    op.drop_table("preprocessing_plans")
    op.drop_table("workers")
    with op.batch_alter_table("campaigns", schema=None) as batch_op:
        batch_op.drop_index("ix_campaigns_state_priority")
        batch_op.drop_index(batch_op.f("ix_campaigns_scan_key"))
        batch_op.drop_index("ix_campaigns_owner_id_id")

    op.drop_table("campaigns")
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_tokens_user_id"))

    op.drop_table("api_tokens")
    op.drop_table("users")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index("ix_events_kind_state")
        batch_op.drop_index("ix_events_campaign_id_id")

    op.drop_table("events")
