"""Test doubles of external services, shared by the host, container and integration tests."""
