"""Console access levels, lowest first; each includes the ones below it.

A level becomes permissions named `level:<name>` so the one guard checks it like any
permission: an operator is allowed `level:none`, `level:user`, `level:viewer` and
`level:operator`.
"""
from __future__ import annotations

NONE, USER, VIEWER, OPERATOR, ADMIN = "none", "user", "viewer", "operator", "admin"
ORDER = (NONE, USER, VIEWER, OPERATOR, ADMIN)
GRANTABLE = ORDER[1:]                   # what an admin may approve someone with
RANK = {name: rank for rank, name in enumerate(ORDER)}


def permission(level: str) -> str:
    return "level:" + level


_ALLOWED = {level: frozenset(permission(below) for below in ORDER[:RANK[level] + 1])
            for level in ORDER}


def allowed(level: str) -> frozenset[str]:
    return _ALLOWED[level]


def of_permission(name: str) -> str:
    return name.partition(":")[2]
