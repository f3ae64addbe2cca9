"""The DuckDB warehouse: the only place with SQL. See db.py (connection, migrations, writes), ids.py
(content-hash keys) and queries.py (named queries the stages and the CLI use)."""

from sage.warehouse.db import Warehouse, WarehouseBusy, WarehouseError, storage_error, warehouse_path
from sage.warehouse.ids import content_id, norm_hash, normalise_text, seed_from_id

__all__ = ["Warehouse", "WarehouseBusy", "WarehouseError", "storage_error", "warehouse_path", "content_id", "norm_hash", "normalise_text", "seed_from_id"]
