"""The DuckDB warehouse: the only place with SQL. See db.py (connection, migrations, writes), errors.py (what
goes wrong, in words), ids.py (content-hash keys) and queries.py (named queries the stages and the CLI use)."""
# pyright: basic

# This folder is the package `sage.warehouse` (`sage/warehouse` links here); imported as a bare `warehouse` it would
# be a second copy of every module, with its own enums and state.
if __name__ != "sage.warehouse":
    raise ImportError(f"import sage.warehouse, not {__name__}: this folder is the package sage.warehouse")

from sage.warehouse.db import Warehouse, snapshot_path, warehouse_path
from sage.warehouse.errors import WarehouseBusy, WarehouseError, storage_error
from sage.warehouse.ids import content_id, norm_hash, normalise_text, seed_from_id

__all__ = ["Warehouse", "WarehouseBusy", "WarehouseError", "storage_error", "warehouse_path", "snapshot_path",
           "content_id", "norm_hash", "normalise_text", "seed_from_id"]
