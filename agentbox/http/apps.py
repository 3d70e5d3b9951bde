"""The app hook's former home: `agentbox.apps` now (docs/apps.md). Kept for one
release so that apps written against it still import; import agentbox.apps instead."""

from agentbox.apps import (
    App,
    Host,
    api_document,
    default_agents,
    load_apps,
    prune_alone,
    schemas_of,
)

__all__ = ["App", "Host", "api_document", "default_agents", "load_apps", "prune_alone",
           "schemas_of"]
