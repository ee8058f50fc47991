"""Code several test files share: constants, builders and assertions (fixtures live in the
conftest.py of the folder whose tests use them)."""
