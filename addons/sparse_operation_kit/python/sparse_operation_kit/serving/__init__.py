"""Serving without SOK (sok.save_stock_saved_model). Below tables: tables and lookups ask
serving.active() whether a freeze is tracing; serving itself sees tables only by duck typing.
Imports runtime only."""
