"""Reading the probe rings: attach, read and decode them (ingest), screen their records against the
agent's limits (record_limits, limits_config), and keep several engines apart (engine_scope,
engine_label_config)."""
