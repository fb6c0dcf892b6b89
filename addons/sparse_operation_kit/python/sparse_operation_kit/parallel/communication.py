"""NVIDIA SOK 2.x's `sok.set_comm_tool(name)`: the engine that moves rows between ranks."""
from sparse_operation_kit.runtime.context import context, init

COMM_TOOLS = ("horovod",)


def set_comm_tool(name: str) -> None:
    """Selects the communication engine. SOK communicates through Horovod only: "horovod" sets up
    SOK as sok.init() does (with Horovod when the process runs under horovodrun or Horovod is
    initialised); any other name is an error."""
    if name not in COMM_TOOLS:
        raise ValueError(
            f"sok.set_comm_tool: unknown communication tool {name!r}; SOK communicates through "
            "'horovod' (start the job with horovodrun, call hvd.init() and sok.init())"
        )
    if not context.initialized:
        init()
