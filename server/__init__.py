"""pymq broker (installed as ``pymq_server``): network front, broker core, holding storage, cluster, admin."""
