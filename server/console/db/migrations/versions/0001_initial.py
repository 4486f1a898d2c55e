"""The first schema: users, refresh tokens, devices, pairing tokens.

Revision ID: 0001
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("username", sa.String(64), nullable=False, unique=True),
        sa.Column("password_hash", sa.String(255), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("level", sa.String(16)),
        sa.Column("reason", sa.String(500)),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("decided_at", sa.BigInteger),
        sa.Column("decided_by", sa.String(64)),
    )
    op.create_table(
        "refresh_tokens",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("user_id", sa.String(32), sa.ForeignKey("users.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("family", sa.String(32), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("expires_at", sa.BigInteger, nullable=False),
        sa.Column("used_at", sa.BigInteger),
        sa.Column("revoked_at", sa.BigInteger),
    )
    op.create_index("ix_refresh_tokens_family", "refresh_tokens", ["family"])
    op.create_table(
        "devices",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("inference_url", sa.String(512), nullable=False),
        sa.Column("cluster_url", sa.String(512), nullable=False),
        sa.Column("api_key_sealed", sa.LargeBinary, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("last_seen_at", sa.BigInteger),
        sa.Column("created_by", sa.String(64), nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "pairing_tokens",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("digest", sa.String(64), nullable=False, unique=True),
        sa.Column("created_by", sa.String(64), nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("expires_at", sa.BigInteger, nullable=False),
        sa.Column("used_at", sa.BigInteger),
        sa.Column("device_id", sa.String(32), sa.ForeignKey("devices.id", ondelete="SET NULL")),
    )


def downgrade() -> None:
    op.drop_table("pairing_tokens")
    op.drop_table("devices")
    op.drop_index("ix_refresh_tokens_family", table_name="refresh_tokens")
    op.drop_table("refresh_tokens")
    op.drop_table("users")
