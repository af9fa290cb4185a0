"""The ground floor: errors, settings, size parsing and the name for open JSON objects.

Every room may import these; they import nothing of the package (only the
standard library, msgspec and python-dotenv), so reading the settings never pulls
a database driver or Celery.
"""
