"""The session's tornado handlers (server_ext/ENDPOINTS.md), one module per part they front: thin
handlers that check the caller, ask the logic module beside them and answer.

- ``runner``: ``labfleet/runner`` and the proxy to the inference command (``labfleet.session.runner``);
- ``fleet``: ``labfleet/session``, ``usage``, ``vfolders``, ``quota``, ``sessions`` and the service's
  ``api`` (``labfleet.session.fleet``, ``calls``, ``usage``);
- ``apps``: ``labfleet/apps`` and the image's ports handed to jupyter-server-proxy (``labfleet.session.apps``).

``labfleet.session.extension`` registers them. Every jupyter-server handler of the extension is defined
here (tests/unit/test_session_handlers_layout.py).
"""

# The authorization resource of these endpoints (jupyter-server's Authorizer; under the Hub, the singleuser
# authorizer checks the token's access:servers scope for it).
AUTH_RESOURCE = "labfleet"
