"""Process-wide state: which communication engine is in use, and this process's rank."""


class _Context:
    def __init__(self):
        self.initialized = False
        self.hvd = None  # horovod.tensorflow when running under horovodrun

    @property
    def rank(self):
        return self.hvd.rank() if self.hvd is not None else 0

    @property
    def world_size(self):
        return self.hvd.size() if self.hvd is not None else 1


context = _Context()


def init(use_horovod=None):
    """Initialises SOK. Uses Horovod when it is initialised (call hvd.init() first).

    In one process without Horovod it is a no-op apart from bookkeeping, so scripts written for
    several workers also run alone.
    """
    hvd = None
    if use_horovod is not False:
        try:
            import horovod.tensorflow as hvd_module
            try:
                hvd_module.size()
                hvd = hvd_module
            except ValueError as e:
                if use_horovod:
                    raise RuntimeError("sok.init(use_horovod=True): call hvd.init() first") from e
        except ImportError:
            if use_horovod:
                raise
    context.hvd = hvd
    context.initialized = True
    return context


def rank():
    return context.rank


def num_ranks():
    return context.world_size
