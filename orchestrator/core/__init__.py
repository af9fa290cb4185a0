"""The ground floor: errors, settings and size parsing.

Every room may import these; they import nothing of the package (only the
standard library and pydantic-settings), so reading the settings never pulls
a database driver or Celery.
"""
