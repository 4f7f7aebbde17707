"""``python -m admin_dashboards``: the admin console's server (``jupyterhub-singleuser`` with the
console's config), which stops when the Hub that started it dies, as the labfleet service does: a
console left behind by a killed Hub would keep its port, and the next Hub could not start it."""

import sys

from jupyterhub.singleuser import main

from hub_ext.service.app import exit_with_parent_signal

if __name__ == "__main__":
    exit_with_parent_signal()
    sys.exit(main())
