"""Pure analyses over DataFrames of probe events (parse once, analyse with stateless functions)."""
