"""The database, which holds the truth (the broker only says "look").

Engines and sessions, tables and Alembic migrations, the message log,
groups, runs, leases, scheduled tasks, history edits, export/import, which
channels a group is attached to, the deliveries ledger, the fleet's hosts and
where groups are placed on them.  Imports ``core`` and ``model``.

Every SQL statement is here: no module outside this room imports SQLAlchemy or
the table mappings (``tests/host/test_store_owns_sql.py``); the others call the
store's functions, handing in their ``Connection`` or ``Session`` (from
``store.db``) where a statement belongs to their transaction.
"""
