"""Prefect flows and the `sage` CLI: the one controller that holds the control flow."""

# This folder is the package `sage.flows` (`sage/flows` links here); imported as a bare `flows` it would be a second
# copy of every module, with its own enums and state.
if __name__ != "sage.flows":
    raise ImportError(f"import sage.flows, not {__name__}: this folder is the package sage.flows")

import os

# An offline tool: no usage telemetry from Prefect's ephemeral server, nor from its client (whose first run in a
# terminal prints a notice above the display), unless the user asks for it: DO_NOT_TRACK=0 (which the Hugging Face
# Hub honours too) turns Prefect's client telemetry on.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
