"""The ``labfleet`` command: set up labfleet and manage tenants, policies, keypairs, images
and storage hosts::

    labfleet init
    labfleet domain create acme --slots cpu=64,mem=256g,gpu=4
    labfleet project create acme/vision --slots gpu.shares=2.5
    labfleet user create alice --domain acme --project acme/vision
    labfleet keypair issue alice
    labfleet demo

One module per context, on one command base (:mod:`labfleet.cli.base`, which prints through
:mod:`labfleet.cli.output`): ``init`` (init, demo), ``tenancy`` (domain, project, user),
``policies``, ``keypairs``, ``compute`` (image), ``storage`` (storage-host) and ``imports``
(import, import-credential); :mod:`labfleet.cli.app` puts them together and has ``main()``.

Every change goes through the same logic functions as the REST API, inside one DB transaction
that is rolled back on any error, so the CLI validates, authorizes (as the trusted ``cli``
actor) and audits exactly like the service does. The exceptions are a user's commands that only
the running service can carry out (``labfleet import``): they call its REST API as that user,
with a keypair or a Hub token from the environment (:mod:`labfleet.cli.client`).

Errors are one line on stderr, ``labfleet: error: <message>``, with exit status 2 for bad usage
or bad input and 1 for an operation that was refused (unknown target, duplicate, conflict,
uninitialized database).
"""

from labfleet.cli.app import main

__all__ = ["main"]
