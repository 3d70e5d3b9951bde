"""The second app of the tests: a backup of every exported mix, written from
agentbox/docs/apps.md alone (tests/test_apps.py runs it in a real server)."""
