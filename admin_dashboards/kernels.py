"""The admin service's kernels get no token of the service's: only the viewer's own (:mod:`.viewer`)."""

from __future__ import annotations

import os
from typing import Any

from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

# What a kernel must never see: the service's own Hub token and any labfleet secret.
SECRET_ENV = ("JUPYTERHUB_API_TOKEN", "JPY_API_TOKEN", "LABFLEET_SERVICE_TOKEN", "LABFLEET_METRICS_TOKEN")


def kernel_environment(env: dict[str, str] | None) -> dict[str, str]:
    """``env`` (default: this process's) without the secrets of :data:`SECRET_ENV`."""
    base = dict(os.environ if env is None else env)
    return {k: v for k, v in base.items() if k not in SECRET_ENV and not k.endswith("_SECRET")}


class ViewerKernelManager(AsyncMappingKernelManager):
    """A kernel manager whose kernels start without the service's secrets in their environment."""

    async def start_kernel(self, **kwargs: Any) -> str:  # type: ignore[override]
        kwargs["env"] = kernel_environment(kwargs.get("env"))
        return await super().start_kernel(**kwargs)
