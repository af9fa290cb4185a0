"""Alembic environment: always runs on the connection the caller passes in
(``orchestrator.store.db.Database.migrate``), so the app's URL handling and locks
apply.  For autogenerate, pass ``-x url=...``."""

from alembic import context
from sqlalchemy import create_engine

from orchestrator.store.tables import Base

target_metadata = Base.metadata
connection = context.config.attributes.get("connection")

if connection is None:
    url = context.get_x_argument(as_dictionary=True).get("url", "sqlite:///data/orchestrator.db")
    with create_engine(url).connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
else:
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
