"""The console's storage: SQLAlchemy Core over asyncio (aiosqlite or asyncpg), Alembic migrations."""
