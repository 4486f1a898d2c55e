"""The power contract, modelled on USB Power Delivery.

The controller of a connected power module is the source: it posts its capabilities, up to
seven power data objects (PDOs), the first always the fixed 5 V one (vSafe5V). The cluster is
the sink: it picks one object, as a PD sink's policy would, and says how much it will draw.

* Demand is the sum of the `power.max_mw` of the nodes that are up; the minimum, the sum of
  their `power.idle_mw`. An object is acceptable when its voltage (or some voltage of its
  range) lies within `power.min_voltage_mv` .. `power.max_voltage_mv`.
* Among acceptable objects the one offering the most power up to the demand wins; ties go to
  the lower voltage, then to the lower position. For a range (variable, PPS) the operating
  voltage is the lowest that gives that power. No object reaching the minimum: `rejected`,
  and the 5 V default stays in force.
* The granted power is shared out: every node first gets its idle draw, the rest in proportion
  to its headroom (max - idle). A node's compute scale is the share of its headroom it got;
  the engines run that share of their threads and slots (never below one).
* A PPS contract is a lease: renewed by posting again within 10 s, else it falls back to the
  5 V object.
Units are milli-units throughout (mV, mA, mW).
"""
from __future__ import annotations

import math
import os
import secrets
import time
from dataclasses import dataclass

import orjson

from ..errors import invalid
from ..system.files import write_private_file

MAX_OBJECTS = 7
PPS_LEASE_SECONDS = 10
VSAFE5V_MV = 5000
TYPES = {
    "fixed": ("voltage_mv", "max_current_ma"),
    "variable": ("min_voltage_mv", "max_voltage_mv", "max_current_ma"),
    "battery": ("min_voltage_mv", "max_voltage_mv", "max_power_mw"),
    "pps": ("min_voltage_mv", "max_voltage_mv", "max_current_ma"),
}
FIELD_LIMIT = 1_000_000            # 1 kV, 1 kA, 1 kW: nothing a device's supply offers


@dataclass(frozen=True)
class PowerSettings:
    idle_mw: int = 2000             # a node's draw with its engines idle
    max_mw: int = 15000             # a node's draw at full compute
    min_voltage_mv: int = 5000      # what the cluster's input accepts
    max_voltage_mv: int = 20000


@dataclass(frozen=True)
class NodeBudget:
    node_id: str
    idle_mw: int
    max_mw: int


@dataclass(frozen=True)
class Pdo:
    position: int                   # 1-based, as in PD
    type: str
    min_mv: int
    max_mv: int
    max_current_ma: int | None
    max_power_mw: int | None

    def to_json(self) -> dict:
        out = {"type": self.type}
        if self.type == "fixed":
            out["voltage_mv"] = self.min_mv
        else:
            out["min_voltage_mv"], out["max_voltage_mv"] = self.min_mv, self.max_mv
        if self.max_current_ma is not None:
            out["max_current_ma"] = self.max_current_ma
        if self.max_power_mw is not None:
            out["max_power_mw"] = self.max_power_mw
        return out

    def offer(self, settings: PowerSettings, demand_mw: int) -> tuple[int, int] | None:
        """(the most power this object gives up to the demand's need, at which voltage), or
        None when no voltage of it is acceptable."""
        low, high = max(self.min_mv, settings.min_voltage_mv), min(self.max_mv, settings.max_voltage_mv)
        if low > high:
            return None
        if self.type == "battery":
            return self.max_power_mw, low
        current = self.max_current_ma
        if self.type == "fixed" or current == 0:
            return low * current // 1000, low
        # variable, PPS: the lowest voltage that meets the demand, within the range
        wanted = math.ceil(demand_mw * 1000 / current)
        voltage = min(max(wanted, low), high)
        return voltage * current // 1000, voltage


# ---- parsing ----------------------------------------------------------------------------------

def _number(obj: dict, name: str, where: str) -> int:
    value = obj.get(name)
    if value is None:
        raise invalid(f"'{where}.{name}' is required", f"{where}.{name}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"'{where}.{name}' must be an integer (milli-units)", f"{where}.{name}")
    if not 0 <= value <= FIELD_LIMIT:
        raise invalid(f"'{where}.{name}' must be from 0 to {FIELD_LIMIT}, got {value}", f"{where}.{name}")
    return value


def parse_object(raw, position: int) -> Pdo:
    where = f"source_capabilities[{position - 1}]"
    if not isinstance(raw, dict):
        raise invalid(f"'{where}' must be an object", where)
    kind = raw.get("type")
    if kind not in TYPES:
        raise invalid(f"'{where}.type' must be one of {', '.join(TYPES)}", f"{where}.type")
    values = {name: _number(raw, name, where) for name in TYPES[kind]}
    if kind == "fixed":
        low = high = values["voltage_mv"]
    else:
        low, high = values["min_voltage_mv"], values["max_voltage_mv"]
        if low > high:
            raise invalid(f"'{where}.min_voltage_mv' ({low}) is above its max_voltage_mv ({high})",
                          f"{where}.min_voltage_mv")
    return Pdo(position, kind, low, high, values.get("max_current_ma"), values.get("max_power_mw"))


def parse_request(body: dict) -> tuple[str, list[Pdo]]:
    module_id = body.get("module_id")
    if not isinstance(module_id, str) or not 1 <= len(module_id) <= 128 or not module_id.isprintable():
        raise invalid("'module_id' must be a string of 1 to 128 printable characters", "module_id")
    caps = body.get("source_capabilities")
    if not isinstance(caps, list) or not 1 <= len(caps) <= MAX_OBJECTS:
        raise invalid(f"'source_capabilities' must be an array of 1 to {MAX_OBJECTS} power data objects",
                      "source_capabilities")
    pdos = [parse_object(raw, i + 1) for i, raw in enumerate(caps)]
    first = pdos[0]
    if first.type != "fixed" or first.min_mv != VSAFE5V_MV:
        raise invalid("'source_capabilities[0]' must be the fixed 5 V object (voltage_mv 5000), as "
                      "in USB Power Delivery", "source_capabilities[0]")
    return module_id, pdos


# ---- choosing and sharing out ------------------------------------------------------------------

@dataclass(frozen=True)
class Choice:
    pdo: Pdo
    max_power_mw: int               # what the object gives at the operating voltage
    voltage_mv: int


def select(pdos: list[Pdo], settings: PowerSettings, demand_mw: int, minimum_mw: int) -> Choice | None:
    """The sink's pick, or None when no acceptable object reaches the minimum."""
    best, best_key = None, None
    for pdo in pdos:
        offer = pdo.offer(settings, demand_mw)
        if offer is None:
            continue
        power, voltage = offer
        key = (-min(power, demand_mw), voltage, pdo.position)
        if best_key is None or key < best_key:
            best, best_key = Choice(pdo, power, voltage), key
    if best is None or best.max_power_mw < minimum_mw:
        return None
    return best


def allocate(granted_mw: int, nodes: list[NodeBudget]) -> list[dict]:
    idle = sum(n.idle_mw for n in nodes)
    headroom = sum(n.max_mw - n.idle_mw for n in nodes)
    out = []
    for node in nodes:
        if granted_mw <= idle:
            share = granted_mw * node.idle_mw // idle if idle else 0
        else:
            extra = granted_mw - idle
            room = node.max_mw - node.idle_mw
            share = node.idle_mw + (extra * room // headroom if headroom else 0)
        share = min(share, node.max_mw)
        room = node.max_mw - node.idle_mw
        scale = 1.0 if room <= 0 else max(0.0, min(1.0, (share - node.idle_mw) / room))
        out.append({"node_id": node.node_id, "granted_mw": share, "demand_mw": node.max_mw,
                    "compute_scale": round(scale, 4)})
    return out


def contract(module_id: str, pdos: list[Pdo], settings: PowerSettings, nodes: list[NodeBudget],
             now: float) -> dict:
    demand = sum(n.max_mw for n in nodes)
    minimum = sum(n.idle_mw for n in nodes)
    choice = select(pdos, settings, demand, minimum)
    result = "accepted"
    if choice is None:                               # keep the 5 V default
        result = "rejected"
        power, voltage = pdos[0].offer(PowerSettings(0, 0, VSAFE5V_MV, VSAFE5V_MV), demand)
        choice = Choice(pdos[0], power, voltage)
    operating = min(choice.max_power_mw, demand)
    return {
        "object": "power.contract", "result": result, "contract_id": "pdc-" + secrets.token_hex(8),
        "module_id": module_id, "object_position": choice.pdo.position,
        "pdo": choice.pdo.to_json(), "voltage_mv": choice.voltage_mv,
        "operating_power_mw": operating, "max_power_mw": choice.max_power_mw,
        "capability_mismatch": choice.max_power_mw < demand,
        "demand_mw": demand, "minimum_mw": minimum,
        "allocations": allocate(operating, nodes),
        "lease_expires_at": int(now) + PPS_LEASE_SECONDS if choice.pdo.type == "pps" and result == "accepted" else None,
        "created_at": int(now),
        "source_capabilities": [p.to_json() for p in pdos],
    }


# ---- the contract in force ----------------------------------------------------------------------

class PowerContracts:
    """Holds the contract in force (persisted in DATA_DIR/power.json), runs the PPS lease, and
    tells the engines their compute scale through `apply_scale(node_scale)`."""

    def __init__(self, settings: PowerSettings, data_dir: str, nodes, apply_scale, loop=None):
        self.settings = settings
        self.path = os.path.join(data_dir, "power.json")
        self.nodes = nodes                           # () -> list[NodeBudget]: the nodes up
        self.apply_scale = apply_scale               # (node_id -> scale) -> None
        self.loop = loop
        self.current: dict | None = None
        self._lease = None
        self._restore()

    def negotiate(self, body: dict) -> dict:
        module_id, pdos = parse_request(body)
        return self._put(contract(module_id, pdos, self.settings, self.nodes(), time.time()))

    def in_force(self) -> dict:
        if self.current is not None:
            return self.current
        nodes = self.nodes()
        return {"object": "power.contract", "result": "none", "contract_id": None,
                "demand_mw": sum(n.max_mw for n in nodes), "minimum_mw": sum(n.idle_mw for n in nodes),
                "allocations": [{"node_id": n.node_id, "granted_mw": n.max_mw, "demand_mw": n.max_mw,
                                 "compute_scale": 1.0} for n in nodes]}

    def allocation(self, node_id: str) -> dict | None:
        return next((a for a in self.in_force()["allocations"] if a["node_id"] == node_id), None)

    def _put(self, record: dict) -> dict:
        self.current = record
        write_private_file(self.path, orjson.dumps(record, option=orjson.OPT_INDENT_2))
        self.apply_scale({a["node_id"]: a["compute_scale"] for a in record["allocations"]})
        self._arm_lease()
        return record

    def _arm_lease(self) -> None:
        if self._lease is not None:
            self._lease.cancel()
            self._lease = None
        expires = (self.current or {}).get("lease_expires_at")
        if expires is not None and self.loop is not None:
            self._lease = self.loop.call_later(max(0.0, expires - time.time()), self._lease_expired,
                                               self.current["contract_id"])

    def _lease_expired(self, contract_id: str) -> None:
        """No renewal within the lease: back to the 5 V object of the same source."""
        current = self.current
        if current is None or current["contract_id"] != contract_id:
            return
        self._put(self._fallback(current))

    def _fallback(self, record: dict) -> dict:
        pdos = [parse_object(raw, i + 1) for i, raw in enumerate(record["source_capabilities"])]
        nodes = self.nodes()
        demand = sum(n.max_mw for n in nodes)
        power, voltage = pdos[0].offer(PowerSettings(0, 0, VSAFE5V_MV, VSAFE5V_MV), demand)
        operating = min(power, demand)
        return {**record, "result": "accepted", "contract_id": "pdc-" + secrets.token_hex(8),
                "object_position": 1, "pdo": pdos[0].to_json(), "voltage_mv": voltage,
                "operating_power_mw": operating, "max_power_mw": power,
                "capability_mismatch": power < demand, "allocations": allocate(operating, nodes),
                "lease_expires_at": None, "lease_expired": True, "created_at": int(time.time())}

    def rebalance(self) -> None:
        """The nodes that are up changed: the contract in force is shared out again over them
        (same object and voltage; demand, operating power and allocations follow the nodes)."""
        record = self.current
        if record is None or record.get("result") != "accepted":
            return
        nodes = self.nodes()
        demand = sum(n.max_mw for n in nodes)
        operating = min(record["max_power_mw"], demand)
        self._put({**record, "demand_mw": demand, "minimum_mw": sum(n.idle_mw for n in nodes),
                   "operating_power_mw": operating, "capability_mismatch": record["max_power_mw"] < demand,
                   "allocations": allocate(operating, nodes)})

    def _restore(self) -> None:
        try:
            with open(self.path, "rb") as f:
                record = orjson.loads(f.read())
        except (OSError, ValueError):
            return
        if not isinstance(record, dict) or "allocations" not in record:
            return
        self.current = record
        expires = record.get("lease_expires_at")
        if expires is not None and expires <= time.time():
            record = self._fallback(record)          # the lease ran out while we were down
        self._put(record)
