"""labfleet's notebook widgets (ipywidgets 8, no custom front-end code).

- :class:`SessionLauncher`: start a session in one of my projects, with the quota left shown;
- :class:`Sessions`: my sessions with their status, an open link and a stop button;
- :class:`VFolderBrowser`: my folders and shared ones, usage bars, upload, create;
- :class:`QuotaMeter`: used / left per slot for me, my project and my domain;
- :class:`GPUMonitor`: live GPU utilization and memory of this session;
- :class:`UsageChart`: GPU-hours and CPU-hours, allocated against used (bqplot): mine over the last 30 days,
  or a usage report per user, project, ... (``group_by=``, ``start=``, ``end=``, ``bucket=``).

Each takes ``client=`` (default: this session's own endpoints, :class:`FleetClient` from the kernel's
environment; :class:`labfleet.widgets.fake.FakeFleet` for a demo) and ``refresh_interval=`` seconds.
"""

from .client import FleetClient, FleetError
from .gpu import GPUMonitor
from .launcher import SessionLauncher
from .quota import QuotaMeter
from .sessions import Sessions
from .usage import UsageChart
from .vfolders import VFolderBrowser

__all__ = [
    "FleetClient",
    "FleetError",
    "GPUMonitor",
    "QuotaMeter",
    "SessionLauncher",
    "Sessions",
    "UsageChart",
    "VFolderBrowser",
]
