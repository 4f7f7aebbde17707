"""Who may act at all (labfleet.core.authz.inactive_reason): an inactive user never; a user of a
deactivated domain not until it is active again; a superadmin always, so someone can reactivate it."""

import pytest

from labfleet.core.authz import inactive_reason


@pytest.mark.parametrize(
    ("role", "user_active", "domain_active", "reason"),
    [
        ("user", True, True, None),
        ("admin", True, True, None),
        ("user", False, True, "user ann is inactive"),
        ("user", False, False, "user ann is inactive"),  # the user's own state is said first
        ("user", True, False, "domain acme is inactive"),
        ("admin", True, False, "domain acme is inactive"),  # a domain admin is suspended too
        ("monitor", True, False, "domain acme is inactive"),
        ("superadmin", True, False, None),
        ("superadmin", False, True, "user ann is inactive"),
    ],
)
def test_who_may_act(role, user_active, domain_active, reason):
    assert inactive_reason("ann", role, user_active, "acme", domain_active) == reason
