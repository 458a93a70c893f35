"""Helpers the tests import by name (``from tests.support.pki import issue``); the
fixtures stay in tests/conftest.py.

One module per kind of helper, each loading only what its helpers need, so a test run
pays for the heavy libraries (cryptography, jsonschema, kubernetes_validate) only when
one of its modules imports the helper that uses them.
"""
