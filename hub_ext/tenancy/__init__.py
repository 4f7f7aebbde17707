"""Tenancy: domains, projects, users and their memberships (``directory``), resource policies
(``policies``) and keypairs (``keypairs``). Imports from ``core`` only.
"""
