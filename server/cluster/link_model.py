"""What a tensor split costs per token, from what the cluster measures: each node's compute and
each link's round trip (docs/cluster.md, "Where tensor parallelism pays").

A token of a tensor split is every node's share of the weights, computed at once, plus the
exchanges: after each layer's attention and FFN every node sends its partial sum to every peer
and waits for theirs (2 x n_layer), and the vocabulary projection's rows go to the leader (one
more). Each exchange costs about half a round trip (the frames cross at once, both ways) plus
the time to put the bytes on the link plus a fixed cost of the two ends (system calls, a
thread woken, the sum): EXCHANGE_FIXED_US, measured on loopback where the link itself costs
nothing (bench/tp_exchange.py --native).

    one node:  t1 = work / compute_leader
    tensor:    tp = work / sum(compute)  + L x serial  + (2 L + 1) x (rtt / 2 + bytes / rate + fixed)
               (on one machine, work / sum(compute) + L x serial is at least ONE_MACHINE_STEP_SHARE x t1)

`work` is the model's decode work in the compute figure's unit; it cancels out of the ratio
t1 / tp only if its absolute scale is known, which is what `seconds_per_token` provides: the
leader's own single-stream figure when it has one, else an estimate from the weights.
The planner asks `pays` (speedup at least PAYS_AT); bench/cluster.py's link table is checked
against the same function.
"""
from __future__ import annotations

from dataclasses import dataclass

# Both ends of one exchange, the link's time aside: the two frames' tags (ChaCha20-Poly1305 over
# 2.3 KiB), the system calls, the sum. On loopback a whole exchange (bench/tp_exchange.py
# --native) takes less than half the connect round trip links.py measures in Python, so what is
# left for the ends is small; inside decode steps the rest is one node waiting for the other's
# share (bench/README.md, "Cluster" and "Cluster: the planner's rule against the bench").
EXCHANGE_FIXED_US = 3.0
# What a layer costs on every node of a split whatever its share: its ~15 graph nodes' dispatch,
# the norms, the residual adds, and, for nodes on one machine, the memory they read at once (two
# cores reading together each read less than one alone; a single stream's decode is bound by
# it). Fitted to bench/cluster.py --tensor --trace on two cores: the leader's compute inside a
# SmolLM2 step against half the model alone (bench/README.md, "Cluster").
LAYER_SERIAL_US = 25.0
DEFAULT_RATE_GBIT = 1.0         # a link's rate when nothing says otherwise (a device's Ethernet)
LOOPBACK_RATE_GBIT = 100.0      # nodes on one machine (loopback): memory copies, not a wire
# Nodes on one machine share its memory, and a decode step streams every weight: two cores at
# once each read less than one alone (bench/cluster.py's probe), so two nodes' shards took about
# this share of one node's whole step at best (1B-class, one stream; bench/README.md,
# "Cluster: the tensor split"). On loopback a split's compute is at least this
# share of one node's step. Nodes on machines of their own each read their own memory.
ONE_MACHINE_STEP_SHARE = 0.65
PAYS_AT = 1.15                  # a tensor split is chosen when it predicts this speedup or more
BYTES_PER_VALUE = 8             # partial sums travel as float64 (one node's sums: kernels/src/tp.h)


@dataclass(frozen=True)
class TensorCost:
    one_node_us: float          # a token on the leader alone
    compute_us: float           # the tensor split's share of compute (the slowest node's), with
                                # what every node does whatever its share (LAYER_SERIAL_US a layer)
    exchange_us: float          # one exchange
    exchanges: int              # per token

    @property
    def tensor_us(self) -> float:
        return self.compute_us + self.exchanges * self.exchange_us

    @property
    def speedup(self) -> float:
        return self.one_node_us / self.tensor_us if self.tensor_us > 0 else 0.0

    def describe(self) -> dict:
        return {"one_node_us": round(self.one_node_us, 1), "tensor_us": round(self.tensor_us, 1),
                "exchange_us": round(self.exchange_us, 2), "exchanges": self.exchanges,
                "speedup": round(self.speedup, 3)}


def exchange_us(rtt_us: float, n_embd: int, rate_gbit: float = DEFAULT_RATE_GBIT,
                fixed_us: float = EXCHANGE_FIXED_US) -> float:
    """One exchange of a single token's partial sum (n_embd doubles) over a link with this round
    trip: half the round trip, the bytes at the link's rate, the fixed cost of both ends."""
    wire_us = n_embd * BYTES_PER_VALUE * 8 / (rate_gbit * 1e3)
    return rtt_us / 2 + wire_us + fixed_us


def tensor_cost(one_node_us: float, computes: list[float], rtts_us: list[float], n_layer: int,
                n_embd: int, rate_gbit: float = DEFAULT_RATE_GBIT,
                fixed_us: float = EXCHANGE_FIXED_US) -> TensorCost:
    """`computes`: every node's figure, the leader's first; the split follows them, so each
    node's share takes about as long: the work over their sum. `rtts_us`: the leader's round
    trip to each other node; the slowest link sets every exchange's pace (all wait for all)."""
    leader = computes[0] if computes and computes[0] > 0 else 0.0
    total = sum(c for c in computes if c > 0)
    compute_us = one_node_us * leader / total if leader and total else one_node_us
    if len(computes) > 1:
        compute_us += n_layer * LAYER_SERIAL_US
        if rate_gbit >= LOOPBACK_RATE_GBIT:          # one machine: one memory for every node
            compute_us = max(compute_us, one_node_us * ONE_MACHINE_STEP_SHARE)
    worst = max(rtts_us) if rtts_us else 0.0
    return TensorCost(one_node_us, compute_us, exchange_us(worst, n_embd, rate_gbit, fixed_us),
                      2 * n_layer + 1 if len(computes) > 1 else 0)


def pays(cost: TensorCost, at: float = PAYS_AT) -> bool:
    return cost.exchanges > 0 and cost.speedup >= at


# Our kernels' single-stream decode against the node's compute figure (ggml's 16-column Q4_1
# matmul, compute_speed.py): SmolLM2-135M decodes ~280 tokens/s alone on one Zen 5 core, 268
# MFLOP a token, 75 GFLOP/s, where that core's figure is ~31.5 GFLOP/s.
DECODE_GAIN = 2.4


def seconds_per_token(parameter_count: int, compute_gflops: float) -> float:
    """A single stream's token on one node, estimated from the model's parameters (two
    operations each) and the node's compute figure, scaled to what our kernels decode at."""
    if compute_gflops <= 0:
        return 0.0
    return 2.0 * parameter_count / (compute_gflops * 1e9 * DECODE_GAIN)
