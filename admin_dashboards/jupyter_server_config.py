"""The admin service's jupyter-server (``jupyterhub-singleuser --config=<this file>``): Voila and the
console's short paths, the dashboards' folder, and kernels that get no token of the service's and
that only the console's own user can reach (unix sockets in its private runtime directory)."""

import os
from pathlib import Path

c = get_config()  # noqa: F821 (jupyter-server's config loader defines it)

HERE = Path(__file__).resolve().parent
c.ServerApp.root_dir = str(HERE / "notebooks")
c.ServerApp.default_url = "/admin"
# Only what the console needs: no JupyterLab, no labfleet session extension, no terminals.
c.ServerApp.jpserver_extensions = {
    "voila": True,
    "labfleet.console": True,
    "labfleet.session": False,
    "jupyterlab": False,
    "jupyter_server_terminals": False,
    "jupyter_lsp": False,
    "notebook_shim": False,
    "jupyter_server_proxy": False,
}
c.ServerApp.terminals_enabled = False
c.ServerApp.allow_root = (
    os.geteuid() == 0
)  # the embedded Hub may run as root (its kernels are the viewer's pages)
c.ServerApp.kernel_manager_class = "labfleet.console.kernels.ViewerKernelManager"
# The kernels hold the viewer's token: their channels are ZeroMQ over unix sockets in the console's
# private runtime directory (0700, see __main__.py), beside their connection files, not TCP ports on
# the host's loopback that anyone on the host could try with a connection file.
c.KernelManager.transport = "ipc"
c.VoilaConfiguration.prelaunch_hook = __import__(
    "labfleet.console.viewer", fromlist=["inject_viewer"]
).inject_viewer
c.VoilaConfiguration.show_tracebacks = False  # a traceback could show a cell's source
