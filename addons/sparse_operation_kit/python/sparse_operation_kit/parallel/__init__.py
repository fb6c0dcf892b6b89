"""Where rows live and how they reach the caller: the one-process read (local_rows), the
Horovod all-to-all exchange (distributed, exchange), partitioned tables routing keys to their
parts, and sok.set_comm_tool. Imports runtime, serving and tables."""
