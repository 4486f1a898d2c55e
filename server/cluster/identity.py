"""The node's and the cluster's identifiers: generated once, kept in DATA_DIR/node.json."""
from __future__ import annotations

import os
import secrets
from dataclasses import dataclass

import orjson

from ..system.files import write_private_file


@dataclass(frozen=True)
class Identity:
    node_id: str
    cluster_id: str


def load_or_create(data_dir: str) -> Identity:
    path = os.path.join(data_dir, "node.json")
    try:
        with open(path, "rb") as f:
            raw = orjson.loads(f.read())
        return Identity(raw["node_id"], raw["cluster_id"])
    except FileNotFoundError:
        pass
    identity = Identity("node-" + secrets.token_hex(6), "cluster-" + secrets.token_hex(8))
    write_private_file(path, orjson.dumps({"node_id": identity.node_id,
                                           "cluster_id": identity.cluster_id}))
    return identity
