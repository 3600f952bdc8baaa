"""Finished requests' rows the agent keeps: retention by bytes (retention_config), the kept rows as
column blocks (row_window), and the FinishedRows view the rest of the agent reads (finished_rows)."""
