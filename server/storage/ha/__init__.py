"""High availability over a shared store (spec/ha.md §1–§2): the lease record, the role table, the lease
watch, the fence every durable device asks, and the two media that hold a lease (a shared directory, a
PostgreSQL database)."""
