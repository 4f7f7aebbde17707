"""An environment build's CPU and memory, held in its creator's quota while the build runs.

When the queue starts a build (QUEUED -> BUILDING), :func:`hold` decides in the same transaction
how many cores and bytes its containers get: the service's caps (``environment_build_cpu`` and
``_mem``) cut to what the creator's quota has left (:func:`labfleet.compute.launchoptions.quota_left`:
their keypair's policy, their domain's cap, and the project's for a project environment). It
charges them to the usage ledger on the creator's domain, the environment's project (a project
environment), the creator and their main keypair, as a session's slots are, without counting a
session (a build is none). So admission, ``/api/me`` and the spawn form count them as used
until the build stops holding (:func:`labfleet.core.usage_ledger.release_build`).

A Save as environment holds nothing: its container commit runs in the session's own container,
whose resources the session holds already. Apart from :mod:`labfleet.compute.environments`
because :mod:`labfleet.compute.launchoptions` imports that module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from decimal import ROUND_DOWN, Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from labfleet.compute import launchoptions
from labfleet.compute.environments import BuildOrder
from labfleet.core import usage_ledger
from labfleet.core.display import fmt_bytes
from labfleet.core.envmodels import Environment
from labfleet.core.models import User
from labfleet.core.slots import ResourceSlots, parse_amount, quantum_of

# The least memory a build runs with (the service's own limit may not be set lower either).
MIN_BUILD_MEM = 64 * 2**20
HELD_SLOTS = ("cpu", "mem")


def limits_within(
    cpu_cap: float | None, mem_cap: int | None, left: Mapping[str, Any]
) -> tuple[Decimal | None, int | None, str | None]:
    """(cores, bytes, refusal): the service's caps cut to what the quota has ``left`` (None: no
    limit), cores to whole milli-cores; the refusal says why a build may not run at all."""
    cpu = None
    if cpu_cap is not None:
        cpu = Decimal(repr(float(cpu_cap))).quantize(quantum_of("cpu"), ROUND_DOWN).normalize()
    mem = mem_cap
    if left.get("cpu") is not None:
        have = parse_amount("cpu", left["cpu"])
        cpu = have if cpu is None else min(cpu, have)
    if left.get("mem") is not None:
        mem = int(left["mem"]) if mem is None else min(mem, int(left["mem"]))
    if (cpu is not None and cpu <= 0) or (mem is not None and mem < MIN_BUILD_MEM):
        refusal = (
            f"your quota has {left.get('cpu') or 0} core(s) and {fmt_bytes(int(left.get('mem') or 0))} "
            f"left, and a build needs some CPU and {fmt_bytes(MIN_BUILD_MEM)} of memory: stop a "
            "session, then create the environment again"
        )
        return None, None, refusal
    return cpu, mem, None


def scopes_of(env: Environment, creator: User) -> list[usage_ledger.Scope]:
    """The ledger scopes a build holds its slots in (the ledger's lock order)."""
    scopes: list[usage_ledger.Scope] = [("domain", creator.domain_id)]
    if env.project_id is not None:
        scopes.append(("project", env.project_id))
    scopes.append(("user", creator.id))
    if creator.main_keypair is not None:
        scopes.append(("keypair", creator.main_keypair.id))
    return scopes


def hold(db: Session, order: BuildOrder, cpu_cap: float | None, mem_cap: int | None) -> BuildOrder:
    """``order`` with its limits, held in the creator's quota until the build stops; or with its
    ``refusal``, holding nothing, when the quota has too little left. Call it in the transaction
    of :func:`labfleet.compute.environments.start_build`."""
    if order.source_session is not None:
        return order
    env = db.get(Environment, order.id)
    creator = db.scalar(select(User).where(User.username == order.creator))
    if env is None or creator is None:  # a project environment whose creator was deleted
        return replace(order, cpu_limit=cpu_cap, mem_limit=mem_cap)
    scopes = scopes_of(env, creator)
    # Lock the rows (PostgreSQL) first: no admission takes what is left between reading and holding.
    usage_ledger.charge(db, scopes, {}, reads=dict.fromkeys(scopes, HELD_SLOTS))
    cpu, mem, refusal = limits_within(cpu_cap, mem_cap, launchoptions.quota_left(db, creator, env.project))
    if refusal is not None:
        return replace(order, refusal=refusal)
    slots = ResourceSlots(
        {name: amount for name, amount in (("cpu", cpu), ("mem", mem)) if amount is not None}
    )
    if slots:
        usage_ledger.hold_build(db, env, scopes, slots)
    return replace(order, cpu_limit=None if cpu is None else float(cpu), mem_limit=mem)
