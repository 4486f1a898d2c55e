"""Who may do what, in memory: each account's state and level, as the database says.

The guard runs synchronously on every request and cannot query the database, so the
console keeps this table: loaded at start, updated by the same process on every change
(approve, reject, level change, login, sign-up) and reloaded every few seconds for changes
made elsewhere (the CLI, another console process on the same PostgreSQL). Every change
bumps `generation`, which drops the guard's per-connection caches: a rejected or demoted
user loses access on their very next request.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..auth import levels

PENDING, APPROVED, REJECTED = "pending", "approved", "rejected"


@dataclass(frozen=True, slots=True)
class Account:
    id: str
    username: str
    state: str
    level: str | None           # the granted level, when approved
    reason: str | None

    @property
    def effective_level(self) -> str:
        """A pending or rejected account is level none, whatever it was granted before."""
        return self.level if self.state == APPROVED and self.level else levels.NONE

    @classmethod
    def from_row(cls, row) -> "Account":
        return cls(row.id, row.username, row.state, row.level, row.reason)


class Directory:
    def __init__(self):
        self.accounts: dict[str, Account] = {}
        self.generation = 0

    def replace_all(self, accounts: list[Account]) -> None:
        fresh = {account.id: account for account in accounts}
        if fresh != self.accounts:
            self.accounts = fresh
            self.generation += 1

    def put(self, account: Account) -> None:
        if self.accounts.get(account.id) != account:
            self.accounts[account.id] = account
            self.generation += 1

    def get(self, account_id: str) -> Account | None:
        return self.accounts.get(account_id)
