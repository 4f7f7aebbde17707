"""What the fleet can give now, against what a session asks: the one judgment behind every "free
now", "would wait" and "waits because" that labfleet shows (the Fleet home, the spawn form, the Lab
sidebar, the Hub's progress page, the console's Scheduler page).

Pure: node views as ``GET /api/nodes`` answers them (``status``, ``free`` ``cpu``/``mem``,
``devices`` with ``free`` and ``model``) and a session's slots in, plain values out. A quota says
what a user may still ask; this says what one session could get at once, which is the most one
alive node has free (a session runs on one node). The scheduler's placement decides for real;
this reads the same numbers and says it in words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from labfleet.core.display import fmt_bytes, fmt_duration, number, trim

EPS = 1e-9


@dataclass(frozen=True)
class Need:
    """What a session asks of one node: CPU cores, memory bytes, whole GPUs or a fraction of one GPU
    (never both), restricted to a GPU ``model`` when a per-model slot names one."""

    cpu: float = 0.0
    mem: float = 0.0
    gpu: int = 0
    shares: float = 0.0
    model: str | None = None


def need_of(slots: Mapping[str, Any]) -> Need:
    """A session's slots (``cpu``, ``mem``, ``gpu``, ``gpu.shares``, ``gpu:MODEL`` ...) as a :class:`Need`.

    As the scheduler reads them: ``gpu.shares`` of 1 or more is that many whole devices.
    """
    amounts: dict[str, float] = {}
    model = None
    for name, value in slots.items():
        base, _, named = str(name).partition(":")
        if named and base in ("gpu", "gpu.shares"):
            model = named
        amounts[base] = amounts.get(base, 0.0) + number(value)
    gpu = int(round(amounts.get("gpu", 0.0)))
    shares = round(amounts.get("gpu.shares", 0.0), 2)
    if shares >= 1:
        gpu, shares = gpu + int(shares), 0.0
    return Need(cpu=amounts.get("cpu", 0.0), mem=amounts.get("mem", 0.0), gpu=gpu, shares=shares, model=model)


@dataclass(frozen=True)
class FreeNow:
    """The most one alive node has free of each resource: what a single session could get at once.
    ``gpu``: whole devices free on one node; ``gpu_part``: the largest free part of one device."""

    alive: int
    nodes: int
    cpu: float
    mem: float
    gpu: int
    gpu_part: float

    def to_json(self) -> dict[str, Any]:
        return {
            "alive_nodes": self.alive,
            "nodes": self.nodes,
            "cpu": round(self.cpu, 3),
            "mem": int(self.mem),
            "gpu": self.gpu,
            "gpu.shares": round(self.gpu_part, 2),
        }


def _devices(node: Mapping[str, Any], model: str | None) -> list[Mapping[str, Any]]:
    return [d for d in node.get("devices") or () if model is None or d.get("model") == model]


def _whole_free(devices: Sequence[Mapping[str, Any]]) -> int:
    return sum(1 for d in devices if number(d.get("free")) >= 1 - EPS)


def free_now(nodes: Sequence[Mapping[str, Any]], model: str | None = None) -> FreeNow:
    """What one session could get now from ``nodes`` (a group's), GPUs of ``model`` only if given."""
    alive = [n for n in nodes if n.get("status") == "ALIVE" and n.get("schedulable", True)]
    cpu = mem = part = 0.0
    whole = 0
    for n in alive:
        free = n.get("free") or {}
        devices = _devices(n, model)
        cpu = max(cpu, number(free.get("cpu")))
        mem = max(mem, number(free.get("mem")))
        whole = max(whole, _whole_free(devices))
        part = max([part, *(number(d.get("free")) for d in devices)])
    return FreeNow(alive=len(alive), nodes=len(nodes), cpu=cpu, mem=mem, gpu=whole, gpu_part=part)


@dataclass(frozen=True)
class Verdict:
    """Whether a session fits now, on which node, and the sentence that says it."""

    fits: bool
    node: str | None
    note: str


def judge(slots: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], placement: str = "pack") -> Verdict:
    """What ``nodes`` (a group's) have free now against ``slots``.

    ``fits on NODE now`` when one alive node could take it at once; else ``short of ...`` naming each
    resource no single node has enough of, with the most one node has free; ``placement``
    ``whole-gpu`` rounds a fraction up to a whole device, as the scheduler does.
    """
    if not nodes:
        return Verdict(False, None, "the group has no node: nothing can start in it until one joins")
    alive = [n for n in nodes if n.get("status") == "ALIVE" and n.get("schedulable", True)]
    if not alive:
        return Verdict(
            False,
            None,
            f"no node of the group is alive and schedulable ({len(nodes)} in all): nothing starts until one is",
        )
    need = need_of(slots)
    whole_gpu = placement == "whole-gpu" and need.shares > 0
    best: dict[str, tuple[float, str]] = {}  # resource -> (most free on one node, where)

    def note(key: str, value: float, where: str) -> None:
        if key not in best or value > best[key][0]:
            best[key] = (value, where)

    for n in alive:
        name = str(n.get("name"))
        free = n.get("free") or {}
        cpu_free, mem_free = number(free.get("cpu")), number(free.get("mem"))
        devices = _devices(n, need.model)
        whole_free = _whole_free(devices)
        part = max(devices, key=lambda d: number(d.get("free")), default=None)
        part_free = number(part.get("free")) if part is not None else 0.0
        note("cpu", cpu_free, name)
        note("mem", mem_free, name)
        note("gpu", whole_free, name)
        note("part", part_free, f"{name} GPU {part.get('index')}" if part is not None else name)
        if need.gpu or whole_gpu:
            gpu_ok = whole_free >= max(need.gpu, 1)
        elif need.shares:
            gpu_ok = part_free >= need.shares - EPS
        else:
            gpu_ok = True
        if cpu_free >= need.cpu - EPS and mem_free >= need.mem and gpu_ok:
            return Verdict(True, name, f"fits on {name} now")
    short = []
    model = f" {need.model}" if need.model else ""
    if need.gpu or whole_gpu:
        wanted = max(need.gpu, 1)
        most, where = best["gpu"]
        if most < wanted:
            asks = (
                f"a fraction ({trim(need.shares)}), which placement whole-gpu rounds up to a whole device"
                if whole_gpu
                else f"{wanted} whole{model} GPU{'s' if wanted != 1 else ''}"
            )
            free = f"at most {most:.0f} free on one node ({where})" if most else "none is free on any node"
            short.append(f"GPUs: asks {asks}; {free}")
    elif need.shares:
        most, where = best["part"]
        if most < need.shares - EPS:
            short.append(
                f"GPU share: asks {trim(need.shares)} of one{model} device; the largest free part is "
                f"{trim(most)} ({where})"
            )
    if need.cpu > best["cpu"][0] + EPS:
        cores = "core" if need.cpu == 1 else "cores"
        short.append(f"CPU: asks {trim(need.cpu)} {cores}; at most {trim(best['cpu'][0])} free on one node")
    if need.mem > best["mem"][0]:
        short.append(
            f"memory: asks {fmt_bytes(need.mem)}; at most {fmt_bytes(best['mem'][0])} free on one node"
        )
    if not short:
        short.append("each resource is free somewhere, but no single node has all of it free at once")
    return Verdict(False, None, "short of " + "; ".join(short))


def waits_until(pending_timeout: int | None) -> str:
    """How long a queued session waits, under its group's pending timeout (seconds; 0/None: no bound)."""
    if not pending_timeout or pending_timeout <= 0:
        return "it waits until the capacity is free"
    return f"it waits up to {fmt_duration(pending_timeout)}, then is cancelled"
