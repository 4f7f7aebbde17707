"""What runs inside the Hub process: the labfleet authenticator, the client of the labfleet
service, and ``configure(c)`` that wires labfleet into a JupyterHub config.

Never imports SQLAlchemy or the DB layer: the Hub talks to the service over HTTP.
"""
