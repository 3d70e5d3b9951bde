"""An export log, an app written from agentbox/docs/apps.md alone (tests/test_apps.py)."""
