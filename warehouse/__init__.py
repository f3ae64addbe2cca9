"""The DuckDB warehouse: the only place with SQL. See db.py (connection, migrations, writes), errors.py (what
goes wrong, in words), ids.py (content-hash keys) and queries.py (named queries the stages and the CLI use)."""

from sage.warehouse.db import Warehouse, warehouse_path
from sage.warehouse.errors import WarehouseBusy, WarehouseError, storage_error
from sage.warehouse.ids import content_id, norm_hash, normalise_text, seed_from_id

__all__ = ["Warehouse", "WarehouseBusy", "WarehouseError", "storage_error", "warehouse_path", "content_id", "norm_hash", "normalise_text", "seed_from_id"]
