"""labfleet's words, defined once for every process that uses them: the service, the Hub's
spawners, the session extension, the widgets, the console and the CLI.

Session types, session statuses and the named subsets of them, environment build statuses, slot
names, folder rights and port bounds.
Sizes (their grammar and how bytes read) are in :mod:`labfleet.core.slots`.  Pure: constants only,
importable anywhere (the Hub and sessions included); a test (tests/unit/test_vocabulary.py) finds
any of them typed again elsewhere.
"""

from __future__ import annotations

# ---------------------------------------------------------------- session types

SESSION_TYPES = ("interactive", "batch", "inference")
# The types that run a command (an interactive session serves JupyterLab and runs none).
COMMAND_SESSION_TYPES = ("batch", "inference")

# ---------------------------------------------------------------- session statuses

# In the order a session goes through them.
SESSION_STATUSES = (
    "PENDING",
    "SCHEDULED",
    "PREPARING",
    "RUNNING",
    "TERMINATING",
    "TERMINATED",
    "ERROR",
    "CANCELLED",
)
# Waiting in its resource group's queue: nothing held yet.
PENDING = "PENDING"
# Its server up (the only session saved as an environment).
RUNNING = "RUNNING"
# Placed, its server not up yet.
STARTING_STATUSES = ("SCHEDULED", "PREPARING")
# Holding an allocation (and counted against quotas).
HOLDING_STATUSES = ("SCHEDULED", "PREPARING", RUNNING, "TERMINATING")
# Not ended: queued or holding.
LIVE_STATUSES = (PENDING, *HOLDING_STATUSES)
# Queued, starting or running: live and not on its way out (what a user sees as their sessions).
ACTIVE_STATUSES = (PENDING, *STARTING_STATUSES, RUNNING)
# Ended: nothing changes any more, nothing is held.
FINAL_STATUSES = ("TERMINATED", "ERROR", "CANCELLED")

# ---------------------------------------------------------------- environment statuses

# A user's own environment image ("My Environments"), in the order its build goes through them.
ENVIRONMENT_STATUSES = ("QUEUED", "BUILDING", "READY", "FAILED")
# Its build waits for a slot or runs: not finished yet.
BUILD_PENDING_STATUSES = ("QUEUED", "BUILDING")
# A session asks for an environment's image as ``env:<environment id>`` (the spawn form's value):
# admission checks the environment's base image and who may use it; the session runs its image.
ENVIRONMENT_IMAGE_PREFIX = "env:"

# ---------------------------------------------------------------- slots

# The slots labfleet knows, in the order people read them (per-model slots such as "gpu:A100" aside).
SLOT_NAMES = ("cpu", "mem", "gpu", "gpu.shares")
# What a session is charged and accounted in: whole GPUs count as shares.
CHARGED_SLOTS = ("cpu", "mem", "gpu.shares")
# What every launcher (the spawn form, the Lab sidebar, the launcher widget) offers first: the service
# publishes it in the launch options, so the three start from the same request.
DEFAULT_SESSION_SLOTS = {"cpu": 1, "mem": 2 * 2**30, "gpu": 0}

# ---------------------------------------------------------------- folder rights

# A folder's permission for a member or a mount, weakest first, with the words people read.
FOLDER_RIGHTS = {"ro": "read-only", "rw": "read-write", "wd": "read-write-delete"}
FOLDER_PERMISSIONS = tuple(FOLDER_RIGHTS)

# ---------------------------------------------------------------- ports

PORT_RANGE = (1, 65535)  # any TCP port
# The port an inference command (or an app) listens on in its session: not a privileged one.
COMMAND_PORT_RANGE = (1024, PORT_RANGE[1])
