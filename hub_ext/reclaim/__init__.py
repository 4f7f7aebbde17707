"""Idle reclamation: give back what nobody uses, never kill work in progress, and warn first.

- ``checkers``: the judgments (activity, utilization, lifetime), plain values only;
- ``rules``: checker definitions and their bindings to domains, projects and resource groups
  (``/api/idle-checkers``);
- ``engine``: the service's ``idle`` job (judge every running session, reclaim through the Hub),
  the ``idle`` object a session shows, the preview, and the session's own activity reports.

Imports from ``core``, ``compute`` and ``usage``; ``service`` and ``cli`` import it.
"""
