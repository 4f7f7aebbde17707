"""labfleet's admin console: Voila dashboards served by the Hub-managed service ``labfleet-admin``.

The service is a jupyter-server run by ``jupyterhub-singleuser`` as a Hub service (the Hub's OAuth,
no confirmation page), with Voila and this package's server extension (:mod:`.extension`: short
paths such as ``/services/labfleet-admin/sessions``). Each dashboard's kernel calls the labfleet
service as the person looking at it, with that viewer's own OAuth token (:mod:`.viewer`), never with a
token of the service's (:mod:`.kernels` keeps those out of the kernels' environment); the labfleet
service then scopes everything as it does for that person. Pages are notebooks in ``notebooks/``,
built from :mod:`.console`.
"""


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "labfleet.console.extension"}]
