"""Prefect flows and the `sage` CLI: the one controller that holds the control flow."""

import os

# An offline tool: no usage telemetry from Prefect's ephemeral server unless the user asks for it.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
