"""The tables, as SQLAlchemy Core metadata. Times are integer epoch seconds on every backend.

The migrations in `migrations/versions` create exactly these; a test compares the two.
"""
from __future__ import annotations

from sqlalchemy import (BigInteger, Column, Float, ForeignKey, Index, LargeBinary, MetaData, String,
                        Table)

from ..dashboard.samples import NAMES as SAMPLE_FIELDS

metadata = MetaData()

users = Table(
    "users", metadata,
    Column("id", String(32), primary_key=True),
    Column("username", String(64), nullable=False, unique=True),
    Column("password_hash", String(255), nullable=False),
    Column("state", String(16), nullable=False),           # pending | approved | rejected
    Column("level", String(16)),                            # user | viewer | operator | admin
    Column("reason", String(500)),                          # why it was rejected
    Column("created_at", BigInteger, nullable=False),
    Column("decided_at", BigInteger),
    Column("decided_by", String(64)),                       # the admin's username
)

refresh_tokens = Table(
    "refresh_tokens", metadata,
    Column("id", String(32), primary_key=True),
    Column("user_id", String(32), ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    Column("family", String(32), nullable=False),           # every rotation of one login
    Column("digest", String(64), nullable=False, unique=True),   # sha256 of the token
    Column("created_at", BigInteger, nullable=False),
    Column("expires_at", BigInteger, nullable=False),
    Column("used_at", BigInteger),                          # rotated: using it again is theft
    Column("revoked_at", BigInteger),
    Index("ix_refresh_tokens_family", "family"),
)

devices = Table(
    "devices", metadata,
    Column("id", String(32), primary_key=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("inference_url", String(512), nullable=False),
    Column("cluster_url", String(512), nullable=False),
    Column("api_key_sealed", LargeBinary, nullable=False),  # AES-GCM; the key is in the data dir
    Column("status", String(16), nullable=False),           # online | offline | unknown
    Column("last_seen_at", BigInteger),
    Column("created_by", String(64), nullable=False),
    Column("created_at", BigInteger, nullable=False),
)

pairing_tokens = Table(
    "pairing_tokens", metadata,
    Column("id", String(32), primary_key=True),
    Column("digest", String(64), nullable=False, unique=True),
    Column("created_by", String(64), nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("expires_at", BigInteger, nullable=False),
    Column("used_at", BigInteger),
    Column("device_id", String(32), ForeignKey("devices.id", ondelete="SET NULL")),
)

# The dashboard's history at one-minute resolution (console.dashboard_days of it): one row per
# device and minute, a column per sample field (dashboard/samples.py FIELDS), NULL where unknown.
device_minutes = Table(
    "device_minutes", metadata,
    Column("device_id", String(32), ForeignKey("devices.id", ondelete="CASCADE"), primary_key=True),
    Column("minute", BigInteger, primary_key=True),             # epoch seconds at the minute's start
    *(Column(name, Float) for name in SAMPLE_FIELDS),
    Index("ix_device_minutes_minute", "minute"),
)
