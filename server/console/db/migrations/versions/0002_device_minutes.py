"""The dashboard's history: a row per device and minute, a column per sample field.

Revision ID: 0002
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# Written out, not imported: a migration stays what it was when the schema moves on.
FIELDS = ("generated_tps", "prompt_tps", "requests_running", "requests_waiting", "ttft_p50_ms",
          "ttft_p95_ms", "itl_p50_ms", "itl_p95_ms", "kv_cache_pct", "memory_used_mb",
          "model_memory_mb", "temperature_c", "power_budget_w", "power_draw_w")


def upgrade() -> None:
    op.create_table(
        "device_minutes",
        sa.Column("device_id", sa.String(32), sa.ForeignKey("devices.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("minute", sa.BigInteger, primary_key=True),
        *(sa.Column(name, sa.Float) for name in FIELDS),
    )
    op.create_index("ix_device_minutes_minute", "device_minutes", ["minute"])


def downgrade() -> None:
    op.drop_index("ix_device_minutes_minute", table_name="device_minutes")
    op.drop_table("device_minutes")
