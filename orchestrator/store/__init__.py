"""The database, which holds the truth (the broker only says "look").

Engines and sessions, tables and Alembic migrations, the message log,
groups, runs, leases, history edits, export/import, which channels a group is
attached to, the deliveries ledger, the fleet's hosts and where groups are
placed on them.  Imports ``core`` and ``model``.
"""
