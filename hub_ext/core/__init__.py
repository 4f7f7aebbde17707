"""The bottom layer: the data model, the DB and its migrations, errors, who may do what (authz),
input checks, slot arithmetic, the audit log, secrets, passwords, request signing and Hub naming.

Every other context imports from here; nothing here imports from another context.
"""
